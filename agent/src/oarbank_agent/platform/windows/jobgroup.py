"""One process group on Windows: a job object and the leader started into it; its members,
its end (Ctrl-Break, then ``TerminateJobObject``), waiting for it to empty, what its record
holds.

``CREATE_NEW_PROCESS_GROUP`` (``groups.py``) makes the leader a console process group too:
``terminate`` is Ctrl-Break to it (Python's default SIGBREAK ends the process), which reaches
only processes sharing the agent's console; without one (a service, or Wine's tests) ``end``
kills at its grace.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from oarbank_agent.platform.windows import jobapi, proctable, winapi
from oarbank_sdk.winjob import JobObject

if TYPE_CHECKING:
    from oarbank_agent.platform.windows.jobwatch import JobWatch

__all__ = ["JobGroup", "GroupOwner", "KILLED_EXIT"]

# What asyncio's and subprocess's own kill give (TerminateProcess(h, 1)): one code, either way.
KILLED_EXIT = 1


class GroupOwner(Protocol):
    """Who keeps the live groups (``groups.WindowsGroups``) and hears their jobs' messages."""

    watch: JobWatch

    def forget(self, group: JobGroup) -> None: ...


@dataclass(eq=False)
class JobGroup:
    """A job object and the leader started into it. ``job`` is None for a bare group (a
    leader this agent did not spawn) and for a record whose job is gone: then only the
    leader counts, known by its start time."""

    leader_pid: int
    name: str | None
    started_ms: int | None
    job: JobObject | None = None
    owner: GroupOwner | None = field(default=None, repr=False)
    key_in_watch: int | None = None

    @property
    def leader(self) -> int:
        return self.leader_pid

    @property
    def key(self) -> str:
        return str(self.leader_pid)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobGroup) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __str__(self) -> str:
        return self.name or str(self.leader_pid)

    def record(self) -> dict[str, Any]:
        return {"leader": self.leader_pid, "job": self.name, "started_ms": self.started_ms}

    def members(self) -> list[int]:
        if self.job is not None and self.job.handle is not None:
            try:
                return self.job.pids()
            except OSError:
                return []
        return [self.leader_pid] if proctable.is_running(self.leader_pid,
                                                          self.started_ms) else []

    def pids(self, table: object | None = None) -> set[int]:
        return set(self.members())

    def alive(self) -> bool:
        return bool(self.members())

    def owns(self, pid: int) -> bool:
        if self.job is not None and self.job.handle is not None:
            return self.job.contains(pid)
        return pid == self.leader_pid and self.alive()

    def terminate(self) -> None:
        with contextlib.suppress(OSError):
            jobapi.ctrl_break(self.leader_pid)

    def kill(self, *, also: int | None = None) -> None:
        if also is not None:
            _kill_pid(also)
        if self.job is not None and self.job.handle is not None:
            with contextlib.suppress(OSError):
                self.job.terminate(KILLED_EXIT)
        else:
            _kill_pid(self.leader_pid)

    async def end(self, grace_s: float) -> bool:
        """Ctrl-Break, wait up to ``grace_s`` for the job to empty, then TerminateJobObject;
        the job's handle is closed after (kill-on-close: nothing can be left in it)."""
        killed = False
        try:
            if not self.alive():
                return False
            self.terminate()
            try:
                await asyncio.wait_for(self.wait_gone(0.2), grace_s)
            except asyncio.TimeoutError:
                killed = True
                self.kill()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.wait_gone(0.05), 5.0)
            return killed
        finally:
            self.release()

    async def wait_gone(self, poll_s: float = 2.0) -> None:
        while True:
            waiter = None
            if self.owner is not None and self.key_in_watch is not None:
                waiter = self.owner.watch.gone(self.key_in_watch)  # before looking: no race
            if not self._active():
                if waiter is not None:
                    waiter.cancel()
                return
            if waiter is None:
                await asyncio.sleep(poll_s)
                continue
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter, poll_s)  # a missed message costs poll_s

    def _active(self) -> bool:
        if self.job is not None and self.job.handle is not None:
            try:
                return jobapi.active_processes(self.job.handle) > 0
            except OSError:
                return False
        return self.alive()

    def oom_kills(self) -> int:
        if self.owner is None or self.key_in_watch is None:
            return 0
        return self.owner.watch.memory_hits(self.key_in_watch)

    def release(self) -> None:
        """Close our handle to the job (its processes end with it if any are left)."""
        if self.owner is not None:
            self.owner.forget(self)
        if self.job is not None:
            self.job.close()


def _kill_pid(pid: int) -> None:
    with contextlib.suppress(OSError):
        process = winapi.open_process(pid, winapi.PROCESS_TERMINATE)
        try:
            winapi.terminate_process(process, KILLED_EXIT)
        finally:
            winapi.close(process)
