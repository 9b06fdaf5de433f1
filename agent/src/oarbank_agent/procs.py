"""Process groups: start every child in a new session, end groups, remember what we started.

Every op, service daemon and runner runs in its own session (so its own process group, pgid =
the leader's pid). The agent writes one small record per group under ``<state>/procs/`` before
anything can escape it, and removes it once the group is gone, so that a restarted agent can
end whatever its predecessor left (``end_leftovers``).

Why the group-emptiness check polls: Linux has no event for "the last member of a process group
exited" when the members are not our children (a service daemon is reparented to init). Only
``end_group``'s bounded grace period polls, never the agent's state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from oarbank_agent import factory
from oarbank_agent.factory.client import FactoryLost
from oarbank_agent.host import cgroups, proctable
from oarbank_agent.sandbox import containment, refusals, resourcelimits
from oarbank_agent.sandbox import policy as sandboxing
from oarbank_sdk.protocol import MAX_HANDLES, current_transport

__all__ = ["ChildProcess", "GroupRecord", "ProcessRegistry", "spawn", "group_alive", "end_group",
           "retire_group", "signal_group", "launch_argv"]


def launch_argv(argv: list[str], walls: sandboxing.Walls | None = None,
                notify_fd: int | None = None) -> list[str]:
    """The hook every op and runner argv goes through before it is executed.

    The installed sandbox policy (``sandboxing.install``) prefixes the SDK's launcher, so that
    this one function decides how every child of the agent is confined (identity when off).
    ``walls``: what the child may read and write (``sandboxing.runner_walls``/``service_walls``;
    None: nothing writable).
    """
    return sandboxing.current().wrap(list(argv), walls, notify_fd)


@dataclass(frozen=True)
class GroupRecord:
    pgid: int
    kind: str  # op | service | runner
    label: str  # e.g. "dev.example.modelserver/model start" or an attempt id
    started: float  # unix time, for people reading the record
    # The leader's start in clock ticks since boot, and the boot: a member that started
    # before the leader, or in another boot, is a reused pgid, not ours. (Wall-clock times
    # are useless for this: the boot-time-based process clock drifts from time.time().)
    start_ticks: int | None = None
    boot_id: str | None = None
    cgroup: str | None = None  # its cgroup when containment uses cgroups (containment.py)


class ProcessRegistry:
    """``<state>/procs/<pgid>.json``: one record per live process group the agent started."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "procs"
        self.dir.mkdir(parents=True, exist_ok=True)

    def add(self, rec: GroupRecord) -> None:
        path = self.dir / f"{rec.pgid}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec.__dict__))
        os.replace(tmp, path)

    def remove(self, pgid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / f"{pgid}.json").unlink()

    def records(self) -> list[GroupRecord]:
        out = []
        for p in sorted(self.dir.glob("*.json")):
            try:
                d = json.loads(p.read_text())
                ticks = d.get("start_ticks")
                cg = d.get("cgroup")
                out.append(GroupRecord(int(d["pgid"]), str(d["kind"]), str(d["label"]),
                                       float(d["started"]),
                                       int(ticks) if ticks is not None else None,
                                       d.get("boot_id"), str(cg) if cg else None))
            except (OSError, ValueError, KeyError, TypeError):
                p.unlink(missing_ok=True)  # a torn record: nothing we could act on safely
        return out

    async def end_leftovers(self, grace_s: float = 2.0) -> list[GroupRecord]:
        """End every recorded group that still has members started by us; clear the records."""
        ended = []
        boot = proctable.boot_id()
        for rec in self.records():
            if rec.boot_id == boot and (proctable.members(rec.pgid, rec.start_ticks) or (
                    rec.cgroup and cgroups.populated(Path(rec.cgroup)))):
                ended.append(rec)
                await end_group(rec.pgid, grace_s, min_ticks=rec.start_ticks,
                                cgroup=Path(rec.cgroup) if rec.cgroup else None)
            self.remove(rec.pgid)
        return ended


class ChildProcess(Protocol):
    """What ``spawn`` returns: an ``asyncio.subprocess.Process`` (direct) or a
    ``factory.client.FactoryProcess``; callers use only this."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


async def spawn(argv: list[str], *, env: dict[str, str], cwd: str | os.PathLike[str],
                stdout: Any, stderr: Any, inherit: tuple[int, ...] = (),
                registry: ProcessRegistry | None = None, kind: str = "op",
                label: str = "", walls: sandboxing.Walls | None = None,
                refusal_key: str | None = None,
                limits: dict[str, str] | None = None) -> ChildProcess:
    """Start ``argv`` in a new session with exactly ``env``; record its group.

    Only the handles in ``inherit`` (plus stdin/stdout/stderr) reach the child, passed the
    transport's way (``oarbank_sdk.protocol``: ``inheritable_kwargs``, or to the process
    factory with SCM_RIGHTS). ``stdout``/``stderr``: a file object or a descriptor.
    With cgroup containment the child enters a cgroup of its own before its own code runs
    (``containment``). Raises ``OSError`` if it cannot be started. ``refusal_key``: count
    the network attempts of the child and all it starts under that key (``refusals``).
    With the process factory installed (``--process-factory on``) the factory forks it;
    otherwise (or when the factory cannot be had) it is started directly, as always.
    ``limits``: cgroup files set in its cgroup before it enters (``resourcelimits``; only
    with cgroup containment, ignored without).
    """
    box = containment.current()
    cg = box.new_cgroup() if box.enabled else None
    watch = (refusals.current().watch(refusal_key)
             if refusal_key and sandboxing.current().enforce else None)
    if watch is not None and watch.child_fd is not None:
        inherit = (*inherit, watch.child_fd)
    inner = launch_argv(argv, walls, watch.child_fd if watch is not None else None)
    maker = factory.current()
    try:
        if cg is not None and limits:
            resourcelimits.write(cg, limits)  # before its first instruction runs in it
        proc: ChildProcess | None = None
        if maker is not None and maker.broken is None and _factory_can_pass(
                stdout, stderr, inherit):
            fds = [(_fd_of(stdout), 1), (_fd_of(stderr), 2), *((fd, fd) for fd in inherit)]
            for retry in (False, True):
                try:
                    proc = await maker.spawn(inner, env=env, cwd=str(cwd), fds=fds,
                                             cgroup=str(cg) if cg is not None else None,
                                             kind=kind, label=label)
                    break
                except FactoryLost as exc:
                    # It died under this spawn (a child it forked is ended by the client):
                    # once more through its successor; with no successor, the direct way.
                    if maker.broken is not None:
                        break
                    if retry:
                        raise OSError(f"{exc}") from None
        if proc is None:
            full = inner if cg is None else box.wrap(inner, cg)
            proc = await asyncio.create_subprocess_exec(
                *full, env=env, cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout, stderr=stderr, start_new_session=True,
                **current_transport().inheritable_kwargs(*inherit),
            )
    except BaseException:
        if watch is not None:
            watch.close()
        if cg is not None:
            with contextlib.suppress(OSError):
                cg.rmdir()
        raise
    assert proc is not None
    if watch is not None:
        watch.spawned()  # only the launcher holds its end now
    if cg is not None:
        box.remember(proc.pid, cg)
    if registry is not None:
        # The record lands right after the fork: an agent killed in between leaves a group
        # nobody records (a known, tiny window; closing it needs an intent record + a marker
        # the child carries, which the exact environment rules out for now).
        registry.add(GroupRecord(proc.pid, kind, label, time.time(), proctable.start_ticks(proc.pid),
                                 proctable.boot_id(), str(cg) if cg is not None else None))
    return proc


def _factory_can_pass(stdout: Any, stderr: Any, inherit: tuple[int, ...]) -> bool:
    """Files or descriptors (not PIPE/DEVNULL), and few enough for one message."""
    ok = all((isinstance(s, int) and s >= 0) or hasattr(s, "fileno") for s in (stdout, stderr))
    return ok and len(inherit) + 2 <= MAX_HANDLES


def _fd_of(stream: Any) -> int:
    """A descriptor for the factory: ``spawn``'s stdout/stderr are files or descriptors."""
    if isinstance(stream, int) and stream >= 0:
        return stream
    if stream is None:
        raise OSError("the process factory needs stdout and stderr given")
    return int(stream.fileno())


def group_alive(pgid: int) -> bool:
    return bool(proctable.members(pgid))


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def end_group(pgid: int, grace_s: float, *, min_ticks: int | None = None,
                    cgroup: Path | None = None) -> bool:
    """SIGTERM the group, wait up to ``grace_s`` for it to empty, then SIGKILL.

    With a cgroup (``cgroup``, or the one ``spawn`` made for this group) every member of the
    cgroup is ended along with the group, also those that left the group; the cgroup is then
    removed. Returns True if it had to SIGKILL. Safe on a group that is already gone.
    """
    box = containment.current()
    cg = cgroup or box.cgroup_of(pgid)
    if cg is not None:
        try:
            return await cgroups.end_cgroup(
                cg, grace_s, pgid=pgid, pgid_alive=lambda: bool(proctable.members(pgid, min_ticks)))
        finally:
            box.forget(pgid)
    if not proctable.members(pgid, min_ticks):
        return False
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    delay = 0.01
    while time.monotonic() < deadline:
        if not proctable.members(pgid, min_ticks):
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
    signal_group(pgid, signal.SIGKILL)
    # SIGKILL cannot be refused; give the kernel a moment to tear the members down.
    for _ in range(50):
        if not proctable.members(pgid, min_ticks):
            break
        await asyncio.sleep(0.02)
    return True


async def retire_group(registry: ProcessRegistry | None, pgid: int, grace_s: float) -> bool:
    """``end_group``, then forget the group's record: how every op, runner and service group
    the agent started is finished. Cancelled during the grace period (the agent is shutting
    down), the group is SIGKILLed at once: a record is never removed while its group may still
    run, and never left behind for a group that is gone. Returns ``end_group``'s answer."""
    cg = containment.current().cgroup_of(pgid)  # end_group forgets it
    try:
        return await end_group(pgid, grace_s)
    except asyncio.CancelledError:
        signal_group(pgid, signal.SIGKILL)
        if cg is not None:
            cgroups.kill(cg)
        raise
    finally:
        if registry is not None:
            registry.remove(pgid)
