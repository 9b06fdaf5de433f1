"""Resources as limits (G4): a stage's ``requires.resources.mem_gb`` and ``cpu`` become limits
on its attempt's group (``memory.max`` and ``cpu.max``), and an attempt the OOM killer ended
fails as a job fault ``oom`` that names the limit.

Where: the platform backend sets them on each attempt's group before the runner starts in it
(``procs.spawn(limits=)``, ``Groups.prepare``), so nothing of the runner runs unlimited
(``platform/linux/limits.py`` says how and when on Linux).

When: only where the backend can enforce them (``Groups.limit_gaps``, asked once at start,
``setup``): otherwise the wall is reported as ``unavailable`` with why, once at start and in
``status`` (``resource_limits``): ``mem_gb`` and ``cpu`` are then admission figures only,
never silently: each loaded stage that asks for one gets a WARNING naming it (``unmet``).

Pure: ``stage_limits`` (the limits and values for a stage), ``oom_reason``, ``Limits``,
``unmet``. Thin: ``setup``, ``oom_fault``; ``install``/``current`` keep what ``setup`` found in
the backend.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

from oarbank_agent import platform
from oarbank_agent.platform.api import Group

__all__ = ["CONTROLLERS", "CPU_PERIOD_US", "Limits", "current", "install", "oom_fault",
           "oom_reason", "setup", "stage_limits", "unmet"]

log = logging.getLogger("oarbank_agent.sandbox.resourcelimits")

CPU_PERIOD_US = 100_000  # cpu.max period: the kernel's default
CPU_MIN_QUOTA_US = 1_000  # the kernel refuses quotas under 1 ms
# controller -> the limit it gives an attempt, and the manifest key it comes from
CONTROLLERS = {"memory": ("memory.max", "requires.resources.mem_gb"),
               "cpu": ("cpu.max", "requires.resources.cpu")}


def stage_limits(mem_gb: float | None, cpu: float | None) -> dict[str, str]:
    """The limits and values a stage's resources give its attempts (none without)."""
    out = {}
    if mem_gb is not None and mem_gb > 0:
        out["memory.max"] = str(int(mem_gb * 2**30))
    if cpu is not None and cpu > 0:
        quota = max(CPU_MIN_QUOTA_US, math.ceil(cpu * CPU_PERIOD_US))
        out["cpu.max"] = f"{quota} {CPU_PERIOD_US}"
    return out


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


def setup(base: object | None, why_not: str) -> Limits:
    """What the backend can enforce for the groups under ``base`` (the containment's; None:
    groups are process groups only here, ``why_not``); logs one line saying what is enforced
    and what is not."""
    limits = Limits(platform.current().groups.limit_gaps(base, why_not))
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


def oom_fault(group: Group | None, mem_gb: float | None) -> str | None:
    """The ``oom`` reason when the OOM killer ended a process of the attempt's ``group`` at
    its limit (asked before the group is ended), else None."""
    if group is None or mem_gb is None:
        return None
    kills = group.oom_kills()
    return oom_reason(mem_gb, kills) if kills else None


def install(limits: Limits) -> None:
    """Keep ``limits`` (``setup``'s) in the backend: what ``current`` answers from now on."""
    platform.current().groups.install_limits(dict(limits.missing))


def current() -> Limits:
    missing = platform.current().groups.limits_missing
    return Limits(dict(missing)) if missing is not None else Limits()
