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
reads its bundle, the settings file and the module's data dir (and its module environments,
``modules/envs.py``); a service's ops and daemon write
only the module's data dir and read the bundle, the settings, limits and tools files; the GPU
device nodes only for a module with ``[sandbox].devices.gpu = "compute"``. Every child is
launched with ``--guard-pid <agent pid>`` (no signal to the agent or its process group). A
runner's signals are scoped to its own sandbox (Landlock); a service's are not (its ``stop``
op signals the daemon its ``start`` op left, which is another launch, another domain): see the
sandbox README for what that leaves open. The agent itself is made undumpable where the
system allows (``set_undumpable``: the backend's), so its memory and environment are root's alone.

What confining means per system (the walls the launcher measures, which of them ``--sandbox
required`` needs, whether the launcher can confine here at all) is the platform backend's
(``platform.current().sandbox``); this module holds the policy, the same everywhere.

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

import logging
import os
import shutil
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from oarbank_agent import platform
from oarbank_sdk import advice, sandbox

__all__ = ["MODES", "SandboxPolicy", "SandboxUnavailable", "resolve", "install", "current",
           "launcher_failure", "Walls", "runner_walls", "service_walls",
           "set_undumpable", "required_walls", "SANDBOX_ESCAPE", "gpu_driver_note"]

log = logging.getLogger("oarbank_agent.sandbox")
SANDBOX_ESCAPE = "sandbox_escape"  # the failure reason of a group with an unconfined process

MODES = ("auto", "required", "off")



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
    nodes and the driver's abstract socket, and the kernel-table writes NVIDIA's driver needs
    only when not root (the SDK's ``_policy.GPU_PROC_WRITE``: as root those would reach
    root-owned sysctls; docs/contract-map.md G15)."""
    if not (enforce and euid == 0 and _gpu_compute(ctx)):
        return None
    return (f"{advice.GPU_UNDER_ROOT}: run the agent as a non-root user "
            "(agent/systemd/oarbank-agent.service)")


def runner_walls(ctx: Any, workdir: os.PathLike[str] | str) -> Walls:
    """A runner: writes its workdir (tmp and home inside); reads its bundle, the module's
    settings file and data dir (read-only: only services write it)."""
    bundle = str(os.path.realpath(ctx.manifest.bundle))
    return Walls(read=(bundle, str(ctx.settings_file), str(ctx.data_dir),
                       *getattr(ctx, "env_dirs", ())),
                 write=(str(workdir),), gpu=_gpu_compute(ctx), signals="scoped")


def service_walls(ctx: Any, node: Any) -> Walls:
    """A service's ops and daemon: write the module's data dir (HOME and TMPDIR inside); read
    the bundle, the settings, limits and tools files."""
    bundle = str(os.path.realpath(ctx.manifest.bundle))
    return Walls(read=(bundle, str(ctx.settings_file), str(node.limits_file),
                       str(node.tools_file), *getattr(ctx, "env_dirs", ())),
                 write=(str(ctx.data_dir),), gpu=_gpu_compute(ctx), signals="open")


def set_undumpable() -> bool:
    """The agent's environment and memory readable by root with capabilities only (its
    children have none), where the system allows. True when it took effect."""
    return platform.current().sandbox.set_undumpable()


def _undumpable() -> str:
    return sandbox.ENFORCED if platform.current().sandbox.undumpable() else sandbox.UNAVAILABLE


def required_walls() -> tuple[str, ...]:
    """Every wall ``--sandbox required`` refuses to start without, on this system."""
    return platform.current().sandbox.required_walls


class SandboxUnavailable(Exception):
    """``--sandbox required`` on a machine where the launcher cannot confine a child."""


@dataclass(frozen=True)
class SandboxPolicy:
    mode: str  # auto | required | off
    enforce: bool  # every child goes through the launcher
    capabilities: dict[str, str] = field(default_factory=dict)  # as probed (empty when off)
    fault: str | None = None  # test hook carried to every launcher (used only when enforcing)
    env_exe: str = "env"
    unavailable: str | None = None  # why the launcher cannot confine here (auto, not enforcing)

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
        own = platform.current().sandbox.walls()  # Windows: its job objects' walls, measured
        if not self.enforce:
            rep: dict[str, Any] = (
                {n: sandbox.ENFORCED if state == sandbox.ENFORCED else sandbox.UNAVAILABLE
                 for n, state in own.items()} if own else
                dict.fromkeys(names, sandbox.UNAVAILABLE))
            rep["endpoints"] = sandbox.UNAVAILABLE
            rep["agent_undumpable"] = _undumpable()
            rep["mode"] = self.mode
            rep["note"] = ("sandbox off (debugging only): jobs and services run unconfined"
                           if self.mode == "off" else
                           f"sandbox not available on this machine ({self.unavailable}): jobs "
                           "and services run unconfined")
            return rep
        rep = {n: self.capabilities.get(n, sandbox.UNAVAILABLE) for n in names}
        needed = platform.current().sandbox.endpoint_walls
        rep["endpoints"] = (sandbox.ENFORCED if all(rep[n] == sandbox.ENFORCED for n in needed)
                            else sandbox.UNAVAILABLE)
        rep["agent_undumpable"] = _undumpable()
        rep["mode"] = self.mode
        if self.fault is not None:
            rep["fault"] = (f"{sandbox.FAULT_ENV}={self.fault}: every launch is made to fail "
                            "(test hook)")
        return rep

    def missing_walls(self) -> list[tuple[str, str]]:
        """(wall, what its absence leaves open) for each wall this node lacks."""
        if not self.enforce:
            return []
        host = platform.current().sandbox
        return [(n, sandbox.WALL_GAPS.get(n, "")) for n in (*host.required_walls, *host.extra_walls)
                if self.capabilities.get(n) != sandbox.ENFORCED]

    def warn_missing(self) -> None:
        """``--sandbox auto`` on a kernel missing walls: one WARNING naming each. (Also logs
        the kernel's sandbox features, e.g. Landlock ABI 6 or more has the signal and
        abstract-unix scopes.)"""
        note = platform.current().sandbox.kernel_note() if self.enforce else None
        if note:
            log.info("sandbox: %s", note)
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
    host = platform.current().sandbox
    cannot = host.unavailable_reason()
    if mode == "required" and cannot is None:
        missing = [n for n in host.required_walls if caps.get(n) != sandbox.ENFORCED]
        if missing:
            raise SandboxUnavailable(
                "--sandbox required, but this kernel lacks walls: " + "; ".join(
                    f"{n} ({sandbox.WALL_GAPS.get(n, 'unavailable')})" for n in missing))
    if cannot is not None:
        if mode == "required":
            raise SandboxUnavailable(
                f"--sandbox required, but the sandbox cannot confine a child on this machine "
                f"({cannot})")
        return SandboxPolicy(mode, False, caps, fault, unavailable=cannot)
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
