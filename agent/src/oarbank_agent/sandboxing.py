"""The agent's sandbox policy: whether its children are confined, and what it reports.

Every op, service daemon and runner is started through ``procs.launch_argv``, which asks the
installed policy (``install``/``current``) to wrap the argv in the SDK's launcher
(``oarbank_sdk.sandbox.wrap``): the launcher confines itself and execs the child in place, so
the daemon an op leaves and everything a runner starts inherit the confinement.

Modes (``oarbank-agent run --sandbox``):

- ``auto`` (default): enforce when ``sandbox.available()`` says the launcher confines here;
  otherwise run unconfined and say so (every capability ``unavailable``).
- ``required``: refuse to start the agent when the sandbox is not available.
- ``off``: no launcher at all. For debugging only; status says so.

Capabilities are measured (the SDK runs its probe child once), never assumed. ``endpoints``
is ``enforced`` only when a confined child can neither make a socket nor bind, connect,
listen or accept on one it holds: then the only connections it has are the ones the agent
handed it.

Test hook: ``OARBANK_SANDBOX_FAULT`` set in the AGENT's environment (the op/runner environment
is exact, so it cannot be set per job). ``resolve`` takes it out of the agent's own
environment before probing (so the report shows what the machine can really do) and the
policy then carries it on every launch (``env OARBANK_SANDBOX_FAULT=<v> <launcher> ...``):
every launcher refuses setup (exit 70) and no child runs. It can only make launches fail.
Ignored (with a warning) when the policy does not enforce.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from oarbank_sdk import sandbox

__all__ = ["MODES", "SandboxPolicy", "SandboxUnavailable", "resolve", "install", "current",
           "launcher_failure", "LAUNCHER_PREFIX"]

MODES = ("auto", "required", "off")
LAUNCHER_PREFIX = "oarbank-sandbox: "  # the launcher's one stderr line when it refuses

# What must hold for a child's only connections to be those the agent hands it.
_ENDPOINT_CAPS_LINUX = ("no_new_privs", "seccomp_listen", "seccomp_socket", "seccomp_bind_connect")


class SandboxUnavailable(Exception):
    """``--sandbox required`` on a machine where the launcher cannot confine a child."""


@dataclass(frozen=True)
class SandboxPolicy:
    mode: str  # auto | required | off
    enforce: bool  # every child goes through the launcher
    capabilities: dict[str, str] = field(default_factory=dict)  # as probed (empty when off)
    fault: str | None = None  # test hook carried to every launcher (used only when enforcing)
    env_exe: str = "env"

    def wrap(self, argv: list[str]) -> list[str]:
        if not self.enforce:
            return list(argv)
        out = sandbox.wrap(list(argv))
        if self.fault is not None:
            out = [self.env_exe, f"{sandbox.FAULT_ENV}={self.fault}", *out]
        return out

    def report(self) -> dict[str, Any]:
        """``{capability: enforced|unavailable, ..., endpoints, mode[, note, fault]}``."""
        names = sandbox.CAPABILITY_NAMES
        if not self.enforce:
            rep: dict[str, Any] = dict.fromkeys(names, sandbox.UNAVAILABLE)
            rep["endpoints"] = sandbox.UNAVAILABLE
            rep["mode"] = self.mode
            rep["note"] = ("sandbox off (debugging only): jobs and services run unconfined"
                           if self.mode == "off" else
                           "sandbox not available on this machine: jobs and services run "
                           "unconfined")
            return rep
        rep = {n: self.capabilities.get(n, sandbox.UNAVAILABLE) for n in names}
        needed = ("macos_seatbelt",) if sys.platform == "darwin" else _ENDPOINT_CAPS_LINUX
        rep["endpoints"] = (sandbox.ENFORCED if all(rep[n] == sandbox.ENFORCED for n in needed)
                            else sandbox.UNAVAILABLE)
        rep["mode"] = self.mode
        if self.fault is not None:
            rep["fault"] = (f"{sandbox.FAULT_ENV}={self.fault}: every launch is made to fail "
                            "(test hook)")
        return rep


def resolve(mode: str, environ: MutableMapping[str, str] | None = None) -> SandboxPolicy:
    """The policy for ``mode``. Raises ``SandboxUnavailable`` (required, not available) or
    ``ValueError`` (unknown mode)."""
    if mode not in MODES:
        raise ValueError(f"unknown sandbox mode {mode!r} (one of: {', '.join(MODES)})")
    env = os.environ if environ is None else environ
    # Out of the agent's own environment before the probe runs: the probe must report what
    # launches here can really get, not the forced failure.
    fault = env.pop(sandbox.FAULT_ENV, None) or None
    if mode == "off":
        return SandboxPolicy(mode, False, fault=fault)
    caps = sandbox.capabilities(refresh=True)
    if not sandbox.available():
        if mode == "required":
            needed = (("macos_seatbelt",) if sys.platform == "darwin"
                      else ("no_new_privs", "seccomp_listen", "seccomp_socket"))
            missing = [n for n in needed if caps.get(n) != sandbox.ENFORCED]
            raise SandboxUnavailable(
                "--sandbox required, but the sandbox cannot confine a child on this machine "
                f"(unavailable: {', '.join(missing) or 'launcher'})")
        return SandboxPolicy(mode, False, caps, fault)
    env_exe = shutil.which("env") or "/usr/bin/env"
    return SandboxPolicy(mode, True, caps, fault, env_exe)


_current = SandboxPolicy("off", False)


def install(policy: SandboxPolicy) -> None:
    """Make ``policy`` the one ``procs.launch_argv`` applies (once, at agent start)."""
    global _current
    _current = policy


def current() -> SandboxPolicy:
    return _current


def launcher_failure(rc: int | None, output: str) -> str | None:
    """A readable reason when exit ``rc`` is the LAUNCHER refusing (70/71, its one stderr line
    in ``output``), not the child's own exit; otherwise None."""
    if rc not in (sandbox.EXIT_SETUP_FAILED, sandbox.EXIT_EXEC_FAILED) or not _current.enforce:
        return None
    for line in reversed(output.splitlines()):
        if line.startswith(LAUNCHER_PREFIX):
            what = line[len(LAUNCHER_PREFIX):].strip()
            kind, _, detail = what.partition(": ")
            if kind not in ("setup failed", "exec failed"):
                continue
            return f"sandbox {kind} (exit {rc}): {detail}"
    return None
