"""Process groups on Linux: POSIX process groups (``posix/groups.py``) read from ``/proc``,
each held by a cgroup of its own when containment uses cgroups (``containment.py``), with its
memory and CPU limits in that cgroup (``limits.py``), waited for through pidfds (``pidfd.py``).

A group's record (``Group.record``) is what a restarted agent needs: the process group id,
the leader's start ticks and the boot (a reused number is not ours), and the cgroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from oarbank_agent.platform.api import Containment, Group
from oarbank_agent.platform.linux import cgroups, limits, pidfd, proctable
from oarbank_agent.platform.linux.containment import Containment as CgroupContainment
from oarbank_agent.platform.linux.containment import resolve as resolve_containment
from oarbank_agent.platform.posix.groups import PosixGroup, PosixGroups, PosixSlot

__all__ = ["LinuxGroup", "LinuxGroups"]


@dataclass(frozen=True, eq=False)
class LinuxGroup(PosixGroup):
    """A process group, and its cgroup when it has one."""

    table: ModuleType = field(default=proctable, repr=False)
    cgroup: Path | None = None
    owner: LinuxGroups | None = field(default=None, repr=False, compare=False)

    def record(self) -> dict[str, Any]:
        return {**super().record(), "cgroup": str(self.cgroup) if self.cgroup else None}

    def pids(self, table: object | None = None) -> set[int]:
        out = super().pids(table)
        if self.cgroup is not None:
            out |= set(cgroups.pids(self.cgroup))
        return out

    def alive(self) -> bool:
        """A member of its process group, or of its cgroup (of this boot)."""
        return self.this_boot() and (bool(self.members()) or (
            self.cgroup is not None and cgroups.populated(self.cgroup)))

    def kill(self, *, also: int | None = None) -> None:
        super().kill(also=also)
        if self.cgroup is not None:
            cgroups.kill(self.cgroup)

    async def end(self, grace_s: float) -> bool:
        """With a cgroup every member of it is ended along with the process group, also those
        that left the group; the cgroup is then removed."""
        if self.cgroup is None:
            return await super().end(grace_s)
        try:
            return await cgroups.end_cgroup(self.cgroup, grace_s, pgid=self.pgid,
                                            pgid_alive=lambda: bool(self.members()))
        finally:
            if self.owner is not None:
                self.owner.forget(self)

    async def wait_gone(self, poll_s: float = 2.0) -> None:
        await pidfd.wait_group_gone(self.pgid, poll_s=poll_s)

    def oom_kills(self) -> int:
        return limits.oom_kills_in(self.cgroup)


class LinuxSlot(PosixSlot):
    """A new session, inside a fresh cgroup when containment uses cgroups."""

    def __init__(self, groups: LinuxGroups, cg: Path | None) -> None:
        super().__init__(groups)
        self._linux = groups
        self.cg = cg

    def wrap(self, argv: list[str]) -> list[str]:
        return argv if self.cg is None else cgroups.enter_argv(argv, self.cg)

    def factory_kwargs(self) -> dict[str, Any]:
        return {"join": str(self.cg / "cgroup.procs") if self.cg is not None else None}

    def started(self, leader: int) -> Group:
        group = LinuxGroup(leader, proctable.start_ticks(leader), proctable.boot_id(),
                           cgroup=self.cg, owner=self._linux)
        if self.cg is not None:
            self._linux.box().remember(leader, self.cg)
        return group

    def abandon(self) -> None:
        if self.cg is not None:
            # A spawn given up after its child was born into the cgroup: nothing else will
            # end that child (the factory's client kills it too, by pid).
            cgroups.kill(self.cg)
            with contextlib.suppress(OSError):
                self.cg.rmdir()  # busy until the killed child is reaped: swept later


class LinuxGroups(PosixGroups):
    table = proctable
    system = "linux"

    def __init__(self) -> None:
        super().__init__()
        self._containment = CgroupContainment("process-group", "cgroups not used (not installed)")

    @property
    def can_inspect(self) -> bool:  # type: ignore[override]
        return os.path.isdir("/proc/self")

    def box(self) -> CgroupContainment:
        return cast(CgroupContainment, self._containment)

    def resolve(self, mode: str, state_dir: Path) -> Containment:
        return resolve_containment(mode, state_dir)

    def limit_gaps(self, base: object | None, why: str) -> dict[str, str]:
        return limits.setup(cast("Path | None", base), why)

    def prepare(self, limits_files: dict[str, str] | None = None) -> LinuxSlot:
        box = self.box()
        cg = box.new_cgroup() if box.enabled else None
        slot = LinuxSlot(self, cg)
        if cg is not None and limits_files:
            try:
                limits.write(cg, limits_files)  # before its first instruction runs in it
            except BaseException:
                slot.abandon()
                raise
        return slot

    def of(self, leader: int) -> Group:
        return LinuxGroup(leader, cgroup=self.box().cgroup_of(leader), owner=self)

    def restore(self, record: dict[str, Any]) -> Group:
        base = cast(PosixGroup, super().restore(record))
        cg = record.get("cgroup")
        return LinuxGroup(base.pgid, base.start_ticks, base.boot_id, restored=True,
                          cgroup=Path(str(cg)) if cg else None, owner=self)

    def adopt(self, group: Group) -> None:
        g = cast(LinuxGroup, group)
        if g.cgroup is not None:
            self.box().remember(g.pgid, g.cgroup)  # ended with it when it stops

    def forget(self, group: Group) -> None:
        self.box().forget(cast(LinuxGroup, group).pgid)

    async def sweep(self, keep: list[Group], grace_s: float) -> list[str]:
        cgs = {g.cgroup for g in cast("list[LinuxGroup]", keep) if g.cgroup is not None}
        return [str(p) for p in await self.box().sweep(cgs, grace_s)]

    def use_child_watcher(self, loop: asyncio.AbstractEventLoop) -> str:
        return pidfd.use_child_watcher(loop)
