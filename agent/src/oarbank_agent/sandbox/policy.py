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

Walls per child (``Walls``, passed by ``procs.spawn``): a runner writes only its workdir and
reads its bundle, the settings file and the module's data dir; a service's ops and daemon write
only the module's data dir and read the bundle, the settings, limits and tools files; the GPU
device nodes only for a module with ``[sandbox].devices.gpu = "compute"``. Every child is
launched with ``--guard-pid <agent pid>`` (no signal to the agent or its process group). A
runner's signals are scoped to its own sandbox (Landlock); a service's are not (its ``stop``
op signals the daemon its ``start`` op left, which is another launch, another domain): see the
sandbox README for what that leaves open. The agent itself is not dumpable
(``PR_SET_DUMPABLE`` 0, ``set_undumpable``), so its /proc files are root's alone.

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

import ctypes
import logging
import os
import shutil
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from oarbank_sdk import advice, sandbox

__all__ = ["MODES", "SandboxPolicy", "SandboxUnavailable", "resolve", "install", "current",
           "launcher_failure", "Walls", "runner_walls", "service_walls",
           "set_undumpable", "REQUIRED_LINUX", "SANDBOX_ESCAPE", "gpu_driver_note"]

log = logging.getLogger("oarbank_agent.sandbox")
SANDBOX_ESCAPE = "sandbox_escape"  # the failure reason of a group with an unconfined process

MODES = ("auto", "required", "off")

# What must hold for a child's only connections to be those the agent hands it.
_ENDPOINT_CAPS_LINUX = ("no_new_privs", "seccomp_listen", "seccomp_socket", "seccomp_bind_connect")
# Every wall ``--sandbox required`` needs (netns is belt and braces over the socket refusal:
# its absence is warned about, not refused).
REQUIRED_LINUX = ("no_new_privs", "seccomp_listen", "seccomp_socket", "seccomp_bind_connect",
                  "seccomp_io_uring", "landlock_fs", "landlock_signal", "landlock_abstract_unix",
                  "caps_dropped", "seccomp_ptrace", "seccomp_privileged", "devices")
_PR_SET_DUMPABLE = 4
_PR_GET_DUMPABLE = 3


@dataclass(frozen=True)
class Walls:
    """What one child may touch besides the system's folders (see ``oarbank_sdk.sandbox``)."""
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    gpu: bool = False
    signals: str = "scoped"  # scoped | open


def _gpu_compute(ctx: Any) -> bool:
    devices = (ctx.manifest.sandbox or {}).get("devices") or {}
    return isinstance(devices, dict) and devices.get("gpu") == "compute"


def gpu_driver_note(ctx: Any, enforce: bool, euid: int) -> str | None:
    """Why a GPU-compute module's CUDA cannot start here, or None. Its children get the GPU
    nodes and the driver's abstract socket, and /proc writes only when not root (the SDK's
    ``_policy.GPU_PROC_WRITE``: a root child writing /proc would reach root-owned sysctls and
    /proc/sysrq-trigger), which NVIDIA's driver needs (docs/contract-map.md G15)."""
    if not (enforce and euid == 0 and _gpu_compute(ctx)):
        return None
    return (f"{advice.GPU_UNDER_ROOT}: run the agent as a non-root user "
            "(agent/systemd/oarbank-agent.service)")


def runner_walls(ctx: Any, workdir: os.PathLike[str] | str) -> Walls:
    """A runner: writes its workdir (tmp and home inside); reads its bundle, the module's
    settings file and data dir (read-only: only services write it)."""
    bundle = str(os.path.realpath(ctx.manifest.bundle))
    return Walls(read=(bundle, str(ctx.settings_file), str(ctx.data_dir)),
                 write=(str(workdir),), gpu=_gpu_compute(ctx), signals="scoped")


def service_walls(ctx: Any, node: Any) -> Walls:
    """A service's ops and daemon: write the module's data dir (HOME and TMPDIR inside); read
    the bundle, the settings, limits and tools files."""
    bundle = str(os.path.realpath(ctx.manifest.bundle))
    return Walls(read=(bundle, str(ctx.settings_file), str(node.limits_file),
                       str(node.tools_file)),
                 write=(str(ctx.data_dir),), gpu=_gpu_compute(ctx), signals="open")


def set_undumpable() -> bool:
    """``PR_SET_DUMPABLE`` 0 for the agent: /proc/<agent>/environ, mem, ... readable by root
    with capabilities only (its children have none). True when it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    return bool(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)


def _undumpable() -> str:
    if not sys.platform.startswith("linux"):
        return sandbox.UNAVAILABLE
    libc = ctypes.CDLL(None, use_errno=True)
    return sandbox.ENFORCED if libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0 else sandbox.UNAVAILABLE


class SandboxUnavailable(Exception):
    """``--sandbox required`` on a machine where the launcher cannot confine a child."""


@dataclass(frozen=True)
class SandboxPolicy:
    mode: str  # auto | required | off
    enforce: bool  # every child goes through the launcher
    capabilities: dict[str, str] = field(default_factory=dict)  # as probed (empty when off)
    fault: str | None = None  # test hook carried to every launcher (used only when enforcing)
    env_exe: str = "env"

    def wrap(self, argv: list[str], walls: Walls | None = None,
             notify_fd: int | None = None) -> list[str]:
        """``notify_fd``: the launcher's end of a ``refusals.Watch`` (network attempts)."""
        if not self.enforce:
            return list(argv)
        w = walls or Walls()  # nothing writable unless said
        out = sandbox.wrap(list(argv), read=w.read, write=w.write, gpu=w.gpu,
                           signals=w.signals, guard_pids=(os.getpid(),), notify_fd=notify_fd)
        if self.fault is not None:
            out = [self.env_exe, f"{sandbox.FAULT_ENV}={self.fault}", *out]
        return out

    def report(self) -> dict[str, Any]:
        """``{capability: enforced|unavailable, ..., endpoints, mode[, note, fault]}``."""
        names = sandbox.CAPABILITY_NAMES
        if not self.enforce:
            rep: dict[str, Any] = dict.fromkeys(names, sandbox.UNAVAILABLE)
            rep["endpoints"] = sandbox.UNAVAILABLE
            rep["agent_undumpable"] = _undumpable()
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
        rep["agent_undumpable"] = _undumpable()
        rep["mode"] = self.mode
        if self.fault is not None:
            rep["fault"] = (f"{sandbox.FAULT_ENV}={self.fault}: every launch is made to fail "
                            "(test hook)")
        return rep

    def missing_walls(self) -> list[tuple[str, str]]:
        """(wall, what its absence leaves open) for each wall this node lacks (Linux)."""
        if not self.enforce or sys.platform != "linux":
            return []
        return [(n, sandbox.WALL_GAPS.get(n, "")) for n in (*REQUIRED_LINUX, "netns")
                if self.capabilities.get(n) != sandbox.ENFORCED]

    def warn_missing(self) -> None:
        """``--sandbox auto`` on a kernel missing walls: one WARNING naming each. (Also logs
        the kernel's Landlock ABI: 6 or more has the signal and abstract-unix scopes.)"""
        if self.enforce and sys.platform == "linux":
            log.info("sandbox: Landlock ABI %d on this kernel", sandbox.landlock_abi())
        missing = self.missing_walls()
        if missing:
            log.warning("sandbox: this kernel lacks %d wall(s); jobs and services run without "
                        "them: %s", len(missing),
                        "; ".join(f"{n} unavailable ({gap})" for n, gap in missing))


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
    if mode == "required" and sys.platform == "linux" and sandbox.available():
        missing = [n for n in REQUIRED_LINUX if caps.get(n) != sandbox.ENFORCED]
        if missing:
            raise SandboxUnavailable(
                "--sandbox required, but this kernel lacks walls: " + "; ".join(
                    f"{n} ({sandbox.WALL_GAPS.get(n, 'unavailable')})" for n in missing))
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
        if line.startswith(sandbox.LAUNCHER_PREFIX):
            what = line[len(sandbox.LAUNCHER_PREFIX):].strip()
            kind, _, detail = what.partition(": ")
            if kind not in ("setup failed", "exec failed"):
                continue
            return f"sandbox {kind} (exit {rc}): {detail}"
    return None
