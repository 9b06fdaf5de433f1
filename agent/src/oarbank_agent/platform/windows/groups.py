"""Process groups on Windows: each a named kill-on-close job object that its leader enters
before its first instruction runs, members from the job, its end a completion-port message.

How a leader enters before it runs: ``Slot.popen_kwargs`` asks ``asyncio.create_subprocess_exec``
(which hands ``creationflags`` on to ``subprocess.Popen``) for ``CREATE_SUSPENDED``, and
``Slot.started`` (called by ``procs.spawn`` right after, with no await between) assigns the
suspended process and resumes it; if that fails it is ended unrun. Children are born in
their parent's job (no breakaway), so the job holds everything the leader starts. Between
the two the process is suspended and in no group's job: so that an agent killed then leaves
nothing either, ``install`` puts the agent itself in a kill-on-close job of its own (held
until it exits), in which every child is born; its group's job is nested in that one
(Windows 8 and later; Wine too). Where the agent cannot enter it (the containment note says
so), that window stays open: a suspended process that never ran. A launcher that assigns
itself was rejected: it would run its own code outside the job first, and the leader would
be the launcher, not the program.

The leader is also made a console process group (``CREATE_NEW_PROCESS_GROUP``), so that
Ctrl-Break can ask it to stop (``jobgroup.py``).

A job is named (``Local\\oarbank-<random>``) so a restarted agent can open it again: with
kill-on-close a job outlives the agent only while someone else holds a handle to it, so a
record usually finds nothing left (its processes ended with the agent), and ``sweep`` has
nothing to find either. The random name is the guard against a squatter (creation refuses
a name that exists); the job gets the agent's default security (its user, SYSTEM).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from oarbank_agent.platform.api import (
    CONTAINMENT_MODES,
    Containment,
    ContainmentUnavailable,
    Group,
    PopenOptions,
)
from oarbank_agent.platform.windows import jobapi, proctable, winapi
from oarbank_agent.platform.windows.jobgroup import KILLED_EXIT, JobGroup
from oarbank_agent.platform.windows.jobwatch import JobWatch
from oarbank_agent.platform.windows.limits import WINE_MEMORY_GAP, job_limits
from oarbank_sdk import winjob
from oarbank_sdk.winjob import JobObject

__all__ = ["JobGroup", "JobSlot", "JobContainment", "WindowsGroups", "KILLED_EXIT"]

CREATE_NEW_PROCESS_GROUP = 0x00000200
NAME_PREFIX = "Local\\oarbank-"
_AGENT_JOB: int | None = None  # the agent's own job (``JobContainment.hold_agent``)
FLAGS = (winjob.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
         | winjob.JOB_OBJECT_LIMIT_DIE_ON_UNHANDLED_EXCEPTION)


@dataclass
class JobContainment:
    """Every group a job object: the only containment Windows offers, so every mode but
    ``cgroup`` is this one."""

    note: str
    owner: WindowsGroups | None = field(default=None, repr=False)
    mode: str = "job-object"

    @property
    def base(self) -> object | None:
        return None

    @property
    def enabled(self) -> bool:
        return True

    def report(self) -> dict[str, Any]:
        return {"containment": self.mode, "containment_note": self.note,
                "containment_base": None}

    def close(self) -> None:
        if self.owner is not None:
            self.owner.close_all()

    def hold_agent(self) -> None:
        """Put this process in a kill-on-close job of its own, once; its handle is never
        closed (closing it would end the agent itself), the kernel closes it at exit."""
        global _AGENT_JOB
        if _AGENT_JOB is None:
            try:
                job = winjob.create_job()
            except OSError as exc:
                self.note += f"; the agent's own job: none ({exc})"
                return
            try:
                winjob.set_limits(job, FLAGS)
                winjob.assign(job, jobapi.CURRENT_PROCESS)
            except OSError as exc:
                winapi.close(job)
                self.note += (f"; the agent's own job: not entered ({exc}), so an agent killed "
                              "while starting a child may leave it suspended")
                return
            _AGENT_JOB = job
        self.note += "; the agent in a kill-on-close job of its own, each group's nested in it"


class JobSlot:
    """A job object made (and limited) for the next leader, which enters it suspended."""

    def __init__(self, groups: WindowsGroups, job: JobObject, name: str) -> None:
        self._groups, self._job, self._name = groups, job, name

    def wrap(self, argv: list[str]) -> list[str]:
        return argv

    def popen_kwargs(self) -> PopenOptions:
        return {"creationflags": winapi.CREATE_SUSPENDED | CREATE_NEW_PROCESS_GROUP}

    def factory_kwargs(self) -> dict[str, Any]:
        return {"join": None}

    def started(self, leader: int) -> Group:
        """Assign the suspended ``leader`` to the job and resume it; raises OSError (having
        ended it unrun and released the job) when it cannot be placed."""
        access = (winapi.PROCESS_SET_QUOTA | winapi.PROCESS_TERMINATE
                  | winapi.PROCESS_SUSPEND_RESUME)
        try:
            process = winapi.open_process(leader, access)
        except OSError:
            self.abandon()
            raise
        try:
            self._job.assign(process)
            winapi.resume_process(process)
        except OSError:
            with contextlib.suppress(OSError):
                winapi.terminate_process(process, KILLED_EXIT)
            self.abandon()
            raise
        finally:
            winapi.close(process)
        group = JobGroup(leader, self._name, proctable.started_ms(leader), self._job,
                         self._groups)
        self._groups.remember(group)
        return group

    def abandon(self) -> None:
        self._job.close()


class WindowsGroups:
    """The Groups part on Windows: job objects, limited where the system enforces it."""

    killed_returncode = KILLED_EXIT
    can_inspect = False  # no kernel status fields (seccomp, no_new_privs) to read

    def __init__(self) -> None:
        self.watch = JobWatch()
        self._live: dict[int, JobGroup] = {}
        self._containment: Containment = JobContainment(
            "a kill-on-close job object per group, no breakaway", self)
        self._missing: dict[str, str] | None = None

    # --- containment and limits -----------------------------------------------------------

    def resolve(self, mode: str, state_dir: Path) -> Containment:
        if mode not in CONTAINMENT_MODES:
            raise ValueError(f"unknown containment {mode!r} (one of: "
                             f"{', '.join(CONTAINMENT_MODES)})")
        if mode == "cgroup":
            raise ContainmentUnavailable("--containment cgroup, but cgroups cannot be used "
                                         "here: they do not exist on Windows (its groups are "
                                         "job objects: --containment auto)")
        why = ("--containment process-group: on Windows every group is a job object anyway "
               "(a console process group cannot end a process's children)"
               if mode == "process-group" else "job objects: Windows' own")
        return JobContainment(f"a kill-on-close job object per group, no breakaway ({why})",
                              self)

    def install(self, containment: Containment) -> None:
        self._containment = containment
        if isinstance(containment, JobContainment):
            containment.hold_agent()

    @property
    def containment(self) -> Containment:
        return self._containment

    def limit_gaps(self, base: object | None, why: str) -> dict[str, str]:
        """Tried on a throwaway job: what the kernel refuses is a gap; Wine's memory limit,
        accepted and not enforced, is one too."""
        gaps: dict[str, str] = {}
        try:
            handle = winjob.create_job()
        except OSError as exc:
            return {c: f"no job object: {exc}" for c in ("memory", "cpu")}
        try:
            try:
                winjob.set_limits(handle, FLAGS, job_memory=1 << 30)
                if jobapi.is_wine():
                    gaps["memory"] = WINE_MEMORY_GAP
            except OSError as exc:
                gaps["memory"] = str(exc)
            try:
                jobapi.set_cpu_rate(handle, 5000)
            except OSError as exc:
                gaps["cpu"] = str(exc)
        finally:
            winapi.close(handle)
        return gaps

    def install_limits(self, missing: dict[str, str]) -> None:
        self._missing = dict(missing)

    @property
    def limits_missing(self) -> dict[str, str] | None:
        return self._missing

    # --- groups ---------------------------------------------------------------------------

    def prepare(self, limits: dict[str, str] | None = None) -> JobSlot:
        values = job_limits(limits or {}, os.cpu_count() or 1)
        name = f"{NAME_PREFIX}{os.getpid()}-{secrets.token_hex(12)}"
        job = JobObject.of_handle(jobapi.create_named_job(name))
        try:
            winjob.set_limits(job._live(), FLAGS, job_memory=values.memory_bytes)
            if values.cpu_rate:
                jobapi.set_cpu_rate(job._live(), values.cpu_rate)
        except BaseException:
            job.close()
            raise
        return JobSlot(self, job, name)

    def remember(self, group: JobGroup) -> None:
        if group.job is not None and group.job.handle is not None and group.key_in_watch is None:
            with contextlib.suppress(OSError):  # without messages: polled
                group.key_in_watch = self.watch.watch(group.job.handle)
        group.owner = self
        self._live[group.leader_pid] = group

    def forget(self, group: JobGroup) -> None:
        if self._live.get(group.leader_pid) is group:
            del self._live[group.leader_pid]
        if group.key_in_watch is not None:
            self.watch.forget(group.key_in_watch)

    def close_all(self) -> None:
        """Agent shutdown: close every job still held (kill-on-close), stop the port."""
        for group in list(self._live.values()):
            group.release()
        self.watch.close()

    def of(self, leader: int) -> Group:
        return self._live.get(leader) or JobGroup(leader, None, proctable.started_ms(leader))

    def restore(self, record: dict[str, Any]) -> Group:
        leader = record["leader"]
        name = record["job"]
        started = record.get("started_ms")
        if not isinstance(leader, int) or isinstance(leader, bool) or leader <= 0:
            raise ValueError(f"record's leader {leader!r} is not a pid")
        if name is not None and (not isinstance(name, str) or not name.startswith(NAME_PREFIX)):
            raise ValueError(f"record's job {name!r} is not one of ours ({NAME_PREFIX}...)")
        if started is not None and not isinstance(started, int):
            raise TypeError(f"record's started_ms {started!r} is not a number")
        handle = jobapi.open_named_job(name) if name else None
        job = JobObject.of_handle(handle) if handle is not None else None
        return JobGroup(leader, name, started, job)

    def adopt(self, group: Group) -> None:
        self.remember(cast(JobGroup, group))

    async def sweep(self, keep: list[Group], grace_s: float) -> list[str]:
        # Kill-on-close: a predecessor's jobs ended with it unless a record (``keep``) names
        # them; an unnamed survivor cannot be found by name, so there is nothing to sweep.
        return []

    def describe(self, group: Group | None) -> dict[str, Any]:
        g = cast("JobGroup | None", group)
        return {"job": g.name if g is not None else None,
                "leader": g.leader_pid if g is not None else None}

    def ending(self, killed: bool, grace_s: float) -> str:
        return (f"Ctrl-Break, then TerminateJobObject after {grace_s:g}s" if killed
                else "Ctrl-Break")

    # --- the process table ----------------------------------------------------------------

    def snapshot(self) -> object:
        return None  # members come from each job, not from a table

    def resident(self, groups: list[Group]) -> dict[Group, int]:
        return {g: proctable.rss(g.members()) for g in groups}

    def process_status(self, pid: int) -> dict[str, str] | None:
        return None

    def cmdline(self, pid: int) -> bytes | None:
        return proctable.cmdline(pid)

    def use_child_watcher(self, loop: asyncio.AbstractEventLoop) -> str:
        return "none needed (the proactor loop waits on process handles)"
