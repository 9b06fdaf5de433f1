"""Resources as limits (G4): a stage's ``requires.resources.mem_gb`` and ``cpu`` become its
attempt cgroup's ``memory.max`` and ``cpu.max`` (cgroup v2), and an attempt the OOM killer
ended fails as a job fault ``oom`` that names the limit.

Where: each attempt gets a cgroup of its own (``containment``, cgroup mode); the limits are
written into it before the runner enters it (``procs.spawn(limits=)``), so nothing of the
runner runs unlimited. ``memory.swap.max`` is set to 0 where it exists: with swap the kernel
would page the attempt out instead of holding it to its limit.

When: only where the controller can be had. A child cgroup gets ``memory.max``/``cpu.max``
only when the controller is enabled in ``cgroup.subtree_control`` of every cgroup above it up
to the agent's own; the agent enables it there at start (``setup``) and, where that cannot be
done (the controller is not offered to the agent's cgroup v2 tree, as on hybrid v1/v2 hosts,
or the agent's own cgroup holds processes that are not the agent's: run it in a cgroup of its
own; the agent and its children are moved into ``<own>/agent`` first, as systemd asks of a
delegated service, since a cgroup that gives controllers to its children holds no process),
reports the wall as ``unavailable`` with why, once at start and in ``status``
(``resource_limits``): ``mem_gb`` and ``cpu`` are then admission figures only, never silently:
each loaded stage that asks for one gets a WARNING naming it (``unmet``).

Pure: ``stage_limits`` (the files and values for a stage), ``oom_kills`` (a ``memory.events``
file's ``oom_kill`` count), ``oom_reason``. Thin I/O: ``setup``, ``write``, ``oom_fault``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CONTROLLERS", "CPU_PERIOD_US", "Limits", "current", "install", "oom_fault",
           "oom_kills", "oom_reason", "setup", "stage_limits", "unmet", "write"]

log = logging.getLogger("oarbank_agent.sandbox.resourcelimits")

CPU_PERIOD_US = 100_000  # cpu.max period: the kernel's default
CPU_MIN_QUOTA_US = 1_000  # the kernel refuses quotas under 1 ms
# controller -> the interface file it gives an attempt, and the manifest key it comes from
CONTROLLERS = {"memory": ("memory.max", "requires.resources.mem_gb"),
               "cpu": ("cpu.max", "requires.resources.cpu")}


def stage_limits(mem_gb: float | None, cpu: float | None) -> dict[str, str]:
    """The cgroup files and values a stage's resources give its attempts (none without)."""
    out = {}
    if mem_gb is not None and mem_gb > 0:
        out["memory.max"] = str(int(mem_gb * 2**30))
    if cpu is not None and cpu > 0:
        quota = max(CPU_MIN_QUOTA_US, math.ceil(cpu * CPU_PERIOD_US))
        out["cpu.max"] = f"{quota} {CPU_PERIOD_US}"
    return out


def oom_kills(memory_events: str) -> int:
    """The ``oom_kill`` count of a ``memory.events`` file's text (0 when absent)."""
    for line in memory_events.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def oom_reason(mem_gb: float, kills: int) -> str:
    return (f"oom: the OOM killer ended {kills} process(es) of the attempt at its memory limit, "
            f"requires.resources.mem_gb = {mem_gb:g} (memory.max = {int(mem_gb * 2**30)} "
            "bytes)")


@dataclass
class Limits:
    """Which limits this agent can set: controller -> None (enforced) or why not."""

    missing: dict[str, str] = field(default_factory=lambda: {
        c: "not set up" for c in CONTROLLERS})

    def files_for(self, mem_gb: float | None, cpu: float | None) -> dict[str, str]:
        """``stage_limits`` for the controllers enforced here."""
        allowed = {CONTROLLERS[c][0] for c in CONTROLLERS if c not in self.missing}
        return {f: v for f, v in stage_limits(mem_gb, cpu).items() if f in allowed}

    def report(self) -> dict[str, Any]:
        return {CONTROLLERS[c][0]: ({"state": "enforced", "why": None} if c not in self.missing
                                    else {"state": "unavailable", "why": self.missing[c]})
                for c in CONTROLLERS}

    def line(self) -> str:
        parts = [f"{CONTROLLERS[c][0]} ({CONTROLLERS[c][1]}) "
                 + ("enforced" if c not in self.missing else f"unavailable: {self.missing[c]}")
                 for c in CONTROLLERS]
        return "resource limits: " + "; ".join(parts)


def _offered_not_enabled(cg: Path) -> bool:
    """Some controller of ours is offered to ``cg`` and not yet given to its children."""
    try:
        offered = set((cg / "cgroup.controllers").read_text().split())
        enabled = set((cg / "cgroup.subtree_control").read_text().split())
    except OSError:
        return False
    return bool((offered - enabled) & set(CONTROLLERS))


def _enable(controller: str, chain: list[Path]) -> str | None:
    """Enable ``controller`` for the children of each cgroup of ``chain`` (top first); None if
    it is enabled all the way down, else why not."""
    for cg in chain:
        try:
            offered = (cg / "cgroup.controllers").read_text().split()
            enabled = (cg / "cgroup.subtree_control").read_text().split()
        except OSError as exc:
            return f"cannot read {cg}: {exc.strerror or exc}"
        if controller in enabled:
            continue
        if controller not in offered:
            return (f"the {controller} controller is not offered to {cg} (its "
                    f"cgroup.controllers: {' '.join(offered) or 'none'})")
        try:
            (cg / "cgroup.subtree_control").write_text(f"+{controller}")
        except OSError as exc:
            return (f"cannot enable {controller} in {cg}/cgroup.subtree_control: "
                    f"{exc.strerror or exc}")
    return None


def _ours(pid: int, me: int) -> bool:
    """``pid`` is this agent or one of its descendants (its /proc parent chain)."""
    for _ in range(64):
        if pid == me:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def _make_room(own: Path) -> str | None:
    """cgroup v2 lets a cgroup other than the root give controllers to its children only while
    no process is in it. The agent's own cgroup (under systemd: its unit's, delegated) holds
    the agent: its processes move into a leaf ``<own>/agent`` first, as systemd asks of a
    delegated service. Only the agent and what it started move; any other process there is
    not the agent's to move: None, or why the room cannot be made."""
    if not (own / "cgroup.type").exists():
        return None  # the root cgroup: exempt from the rule
    try:
        pids = [int(x) for x in (own / "cgroup.procs").read_text().split()]
    except (OSError, ValueError) as exc:
        return f"cannot read {own}/cgroup.procs: {exc}"
    if not pids:
        return None
    me = os.getpid()
    others = [p for p in pids if not _ours(p, me)]
    if others:
        return (f"the agent's cgroup {own} also holds processes that are not the agent's "
                f"({', '.join(map(str, others[:5]))}): run the agent in a cgroup of its own "
                "(systemd: its unit, with Delegate=yes)")
    leaf = own / "agent"
    try:
        leaf.mkdir(exist_ok=True)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                (leaf / "cgroup.procs").write_text(str(pid))
    except OSError as exc:
        return f"cannot move the agent into {leaf}: {exc.strerror or exc}"
    log.info("the agent moved into %s, so that its own cgroup %s may give the memory and cpu "
             "controllers to the attempts' cgroups", leaf, own)
    return None


def setup(base: Path | None, why_no_cgroups: str) -> Limits:
    """Enable what it can from the agent's own cgroup down to ``base``, where each attempt's
    cgroup is made (``<agent's cgroup>/oarbank/<hash>``: containment's layout); logs one line
    saying what is enforced and what is not. ``base`` None: no cgroups here, and why."""
    if base is None:
        limits = Limits({c: f"no cgroup for each attempt here ({why_no_cgroups})"
                         for c in CONTROLLERS})
    else:
        chain = [base.parent.parent, base.parent, base]
        room = _make_room(chain[0]) if _offered_not_enabled(chain[0]) else None
        limits = Limits({c: why for c in CONTROLLERS
                         if (why := room or _enable(c, chain)) is not None})
    # INFO: a limit nobody asks for is no problem; ``unmet`` warns for each stage that asks.
    log.info("%s", limits.line())
    return limits


def unmet(limits: Limits, manifest: Any) -> list[str]:
    """One line per stage of ``manifest`` that asks for a limit not enforced here (its
    ``mem_gb``/``cpu`` then count for admission only)."""
    out = []
    for st in manifest.stages:
        asked = {"memory": st.mem_gb, "cpu": st.cpu}
        for c, value in asked.items():
            if value is not None and c in limits.missing:
                out.append(f"{manifest.id} stage {st.name}: {CONTROLLERS[c][1]} = {value:g} "
                           f"is not enforced here ({CONTROLLERS[c][0]} unavailable: "
                           f"{limits.missing[c]}); it counts for admission only")
    return out


def write(cg: Path, files: dict[str, str]) -> None:
    """Set ``files`` in a fresh cgroup before its first process enters. Raises OSError."""
    for name, value in files.items():
        (cg / name).write_text(value)
    if "memory.max" in files and (cg / "memory.swap.max").exists():
        (cg / "memory.swap.max").write_text("0")


def oom_fault(cg: Path | None, mem_gb: float | None) -> str | None:
    """The ``oom`` reason when the OOM killer ended a process of the attempt's cgroup ``cg``
    (read before the cgroup is removed), else None."""
    if cg is None or mem_gb is None:
        return None
    text = ""
    with contextlib.suppress(OSError):
        text = (cg / "memory.events").read_text()
    kills = oom_kills(text)
    return oom_reason(mem_gb, kills) if kills else None


_current = Limits()


def install(limits: Limits) -> None:
    global _current
    _current = limits


def current() -> Limits:
    return _current
