"""Process groups as POSIX gives them (the macOS backend's, and the base of Linux's): each
group a new session, so its own process group (its id = the leader's pid), ended with
``killpg``; its members found in the process table; "gone" looked for by polling.

Why the emptiness check polls: POSIX has no event for "the last member of a process group
exited" when the members are not our children (a service daemon is reparented to init). Only
``end``'s bounded grace period and ``wait_gone``'s fallback poll, never the agent's state.

``table`` is a process-table module (``posix/proctable.py``: psutil; Linux's reads ``/proc``);
without start times or a boot id every member counts and every record is of this boot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from oarbank_agent.platform.api import (
    CONTAINMENT_MODES,
    Containment,
    ContainmentUnavailable,
    Group,
    PopenOptions,
)
from oarbank_agent.platform.posix import proctable as psutil_table

__all__ = ["PosixGroup", "PosixSlot", "PosixGroups", "PlainContainment", "signal_group",
           "CONTROLLERS"]

CONTROLLERS = ("memory", "cpu")  # what limits are made of (resourcelimits.CONTROLLERS' keys)


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@dataclass(frozen=True, eq=False)
class PosixGroup:
    """A process group: its id (the leader's pid), the leader's start in clock ticks since
    boot and the boot (a member that started before the leader, or in another boot, is a
    reused number, not ours; None where not known)."""

    pgid: int
    start_ticks: int | None = None
    boot_id: str | None = None
    table: ModuleType = field(default=psutil_table, repr=False)
    restored: bool = False  # from a predecessor's record: its boot must be this one

    @property
    def leader(self) -> int:
        return self.pgid

    @property
    def key(self) -> str:
        return str(self.pgid)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PosixGroup) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __str__(self) -> str:
        return str(self.pgid)

    def record(self) -> dict[str, Any]:
        return {"pgid": self.pgid, "start_ticks": self.start_ticks, "boot_id": self.boot_id}

    def members(self) -> list[int]:
        return list(self.table.members(self.pgid, self.start_ticks))

    def pids(self, table: object | None = None) -> set[int]:
        return set(self.table.members(self.pgid, self.start_ticks, table))

    def this_boot(self) -> bool:
        return not self.restored or self.boot_id == self.table.boot_id()

    def alive(self) -> bool:
        return self.this_boot() and bool(self.members())

    def owns(self, pid: int) -> bool:
        return pid in self.pids()

    def terminate(self) -> None:
        signal_group(self.pgid, signal.SIGTERM)

    def kill(self, *, also: int | None = None) -> None:
        if also is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(also, signal.SIGKILL)
        signal_group(self.pgid, signal.SIGKILL)

    async def end(self, grace_s: float) -> bool:
        """SIGTERM the group, wait up to ``grace_s`` for it to empty, then SIGKILL."""
        if not self.members():
            return False
        self.terminate()
        deadline = time.monotonic() + grace_s
        delay = 0.01
        while time.monotonic() < deadline:
            if not self.members():
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
        signal_group(self.pgid, signal.SIGKILL)
        # SIGKILL cannot be refused; give the kernel a moment to tear the members down.
        for _ in range(50):
            if not self.members():
                break
            await asyncio.sleep(0.02)
        return True

    async def wait_gone(self, poll_s: float = 2.0) -> None:
        while self.members():
            await asyncio.sleep(poll_s)

    def oom_kills(self) -> int:
        return 0


@dataclass
class PlainContainment:
    """Process groups only: what every system without cgroups gets."""

    mode: str
    note: str
    base: Path | None = None

    @property
    def enabled(self) -> bool:
        return False

    def report(self) -> dict[str, Any]:
        return {"containment": self.mode, "containment_note": self.note,
                "containment_base": None}

    def close(self) -> None:
        pass


class PosixSlot:
    """A new session for the next leader, nothing around it."""

    def __init__(self, groups: PosixGroups) -> None:
        self._groups = groups

    def wrap(self, argv: list[str]) -> list[str]:
        return argv

    def popen_kwargs(self) -> PopenOptions:
        return {"start_new_session": True}

    def factory_kwargs(self) -> dict[str, Any]:
        return {"join": None}

    def started(self, leader: int) -> Group:
        t = self._groups.table
        return PosixGroup(leader, t.start_ticks(leader), t.boot_id(), t)

    def abandon(self) -> None:
        pass


class PosixGroups:
    """The Groups part with process groups only (no limits, no containment beyond them)."""

    table: ModuleType = psutil_table
    killed_returncode = -signal.SIGKILL
    can_inspect = False
    system = sys.platform  # named in the containment note ("cgroups do not exist on ...")

    def __init__(self, system: str | None = None) -> None:
        if system is not None:
            self.system = system
        self._containment: Containment = PlainContainment(
            "process-group", "cgroups not used (not installed)")
        self._missing: dict[str, str] | None = None

    # --- containment and limits -----------------------------------------------------------

    def check_mode(self, mode: str) -> None:
        if mode not in CONTAINMENT_MODES:
            raise ValueError(f"unknown containment {mode!r} (one of: "
                             f"{', '.join(CONTAINMENT_MODES)})")

    def resolve(self, mode: str, state_dir: Path) -> Containment:
        self.check_mode(mode)
        if mode == "process-group":
            return PlainContainment("process-group",
                                    "cgroups not used (--containment process-group)")
        why = f"cgroups do not exist on {self.system}"
        if mode == "cgroup":
            raise ContainmentUnavailable(f"--containment cgroup, but cgroups cannot be used "
                                         f"here: {why}")
        return PlainContainment("process-group", f"cgroups not usable here: {why}")

    def install(self, containment: Containment) -> None:
        self._containment = containment

    @property
    def containment(self) -> Containment:
        return self._containment

    def limit_gaps(self, base: object | None, why: str) -> dict[str, str]:
        return {c: f"no cgroup for each attempt here ({why})" for c in CONTROLLERS}

    def install_limits(self, missing: dict[str, str]) -> None:
        self._missing = dict(missing)

    @property
    def limits_missing(self) -> dict[str, str] | None:
        return self._missing

    # --- groups ---------------------------------------------------------------------------

    def prepare(self, limits: dict[str, str] | None = None) -> PosixSlot:
        return PosixSlot(self)

    def of(self, leader: int) -> Group:
        return PosixGroup(leader, table=self.table)

    def restore(self, record: dict[str, Any]) -> Group:
        ticks = record.get("start_ticks")
        boot = record.get("boot_id")
        return PosixGroup(int(record["pgid"]), int(ticks) if ticks is not None else None,
                          str(boot) if boot is not None else None, self.table, True)

    def adopt(self, group: Group) -> None:
        pass

    async def sweep(self, keep: list[Group], grace_s: float) -> list[str]:
        return []

    def describe(self, group: Group | None) -> dict[str, Any]:
        return {"pgid": cast(PosixGroup, group).pgid if group is not None else None}

    def ending(self, killed: bool, grace_s: float) -> str:
        return f"SIGTERM, then SIGKILL after {grace_s:g}s" if killed else "SIGTERM"

    # --- the process table ----------------------------------------------------------------

    def snapshot(self) -> object:
        return self.table.proc_table()

    def resident(self, groups: list[Group]) -> dict[Group, int]:
        by_id = {cast(PosixGroup, g).pgid: g for g in groups}
        rss = self.table.group_rss(set(by_id))
        return {g: rss.get(pgid, 0) for pgid, g in by_id.items()}

    def process_status(self, pid: int) -> dict[str, str] | None:
        return cast("dict[str, str] | None", self.table.status(pid))

    def cmdline(self, pid: int) -> bytes | None:
        return cast("bytes | None", self.table.cmdline(pid))

    def use_child_watcher(self, loop: asyncio.AbstractEventLoop) -> str:
        return "default"
