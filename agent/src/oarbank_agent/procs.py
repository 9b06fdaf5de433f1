"""Process groups: start every child in a group of its own, end groups, remember what we started.

Every op, service daemon and runner leads a group of its own (``platform``'s ``Group``: a new
session on POSIX, held by more where the backend can). The agent writes one small record per
group under ``<state>/procs/`` before anything can escape it, and removes it once the group is
gone, so that a restarted agent can end whatever its predecessor left (``recovery``). What a
record says of the group is the backend's (``Group.record``); the agent adds what it is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from oarbank_agent import factory, platform
from oarbank_agent.platform.api import Group
from oarbank_agent.sandbox import policy as sandboxing
from oarbank_agent.sandbox import refusals
from oarbank_sdk.protocol import MAX_HANDLES, current_transport

__all__ = ["ChildProcess", "GroupRecord", "ProcessRegistry", "spawn", "group_of", "retire_group",
           "launch_argv"]


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
    group: Group  # what the backend wrote of it (``Group.record``), read back
    kind: str  # op | service | runner
    label: str  # e.g. "dev.example.modelserver/model start" or an attempt id
    started: float  # unix time, for people reading the record


class ProcessRegistry:
    """``<state>/procs/<group key>.json``: one record per live group the agent started."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "procs"
        self.dir.mkdir(parents=True, exist_ok=True)

    def add(self, rec: GroupRecord) -> None:
        path = self.dir / f"{rec.group.key}.json"
        tmp = path.with_suffix(".tmp")
        doc = {**rec.group.record(), "kind": rec.kind, "label": rec.label,
               "started": rec.started}
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

    def remove(self, group: Group) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.dir / f"{group.key}.json").unlink()

    def forget_gone(self) -> list[str]:
        """Remove the records of groups no longer alive; their labels. For the agent's last
        step: a group handed over between two tasks as the agent stops (a service's start op
        whose daemon said ready on the channel before the op's exit was seen) can miss its
        retirement; its record must not outlive it."""
        gone = [r for r in self.records() if not r.group.alive()]
        for r in gone:
            self.remove(r.group)
        return [r.label for r in gone]

    def records(self) -> list[GroupRecord]:
        groups = platform.current().groups
        out = []
        for p in sorted(self.dir.glob("*.json")):
            try:
                d = json.loads(p.read_text())
                out.append(GroupRecord(groups.restore(d), str(d["kind"]), str(d["label"]),
                                       float(d["started"])))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                p.unlink(missing_ok=True)  # a torn record: nothing we could act on safely
        return out


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
    """Start ``argv`` as the leader of a new group with exactly ``env``; record the group.

    Only the handles in ``inherit`` (plus stdin/stdout/stderr) reach the child, passed the
    transport's way (``oarbank_sdk.protocol``: ``inheritable_kwargs``, or to the process
    factory with SCM_RIGHTS). ``stdout``/``stderr``: a file object or a descriptor.
    Where containment holds groups firmly the child is placed before its own code runs
    (``Groups.prepare``). Raises ``OSError`` if it cannot be started. ``refusal_key``: count
    the network attempts of the child and all it starts under that key (``refusals``).
    With the process factory installed (``--process-factory on``) the factory forks it;
    otherwise (or when the factory cannot be had) it is started directly, as always.
    ``limits``: its memory and CPU limits, set before it starts (``resourcelimits``; only
    where containment can hold them, ignored without). ``group_of(proc)``: its group.
    """
    groups = platform.current().groups
    slot = groups.prepare(limits)
    watch = (refusals.current().watch(refusal_key)
             if refusal_key and sandboxing.current().enforce else None)
    if watch is not None and watch.child_fd is not None:
        inherit = (*inherit, watch.child_fd)
    inner = launch_argv(argv, walls, watch.child_fd if watch is not None else None)
    maker = factory.current()
    try:
        proc: ChildProcess | None = None
        if maker is not None and maker.broken is None and _factory_can_pass(
                stdout, stderr, inherit):
            fds = [(_fd_of(stdout), 1), (_fd_of(stderr), 2), *((fd, fd) for fd in inherit)]
            for retry in (False, True):
                try:
                    proc = await maker.spawn(inner, env=env, cwd=str(cwd), fds=fds,
                                             kind=kind, label=label, **slot.factory_kwargs())
                    break
                except factory.FactoryLost as exc:
                    # It died under this spawn (a child it forked is ended by the client):
                    # once more through its successor; with no successor, the direct way.
                    if maker.broken is not None:
                        break
                    if retry:
                        raise OSError(f"{exc}") from None
        if proc is None:
            options: dict[Any, Any] = {**slot.popen_kwargs(),
                                       **current_transport().inheritable_kwargs(*inherit)}
            proc = await asyncio.create_subprocess_exec(
                *slot.wrap(inner), env=env, cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout, stderr=stderr, **options)
    except BaseException:
        if watch is not None:
            watch.close()
        slot.abandon()
        raise
    assert proc is not None
    if watch is not None:
        watch.spawned()  # only the launcher holds its end now
    group = slot.started(proc.pid)
    if registry is not None:
        # The record lands right after the fork: an agent killed in between leaves a group
        # nobody records (a known, tiny window; closing it needs an intent record + a marker
        # the child carries, which the exact environment rules out for now).
        registry.add(GroupRecord(group, kind, label, time.time()))
    return proc


def group_of(proc: ChildProcess) -> Group:
    """The group ``spawn`` started ``proc`` in (its leader)."""
    return platform.current().groups.of(proc.pid)


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




async def retire_group(registry: ProcessRegistry | None, group: Group, grace_s: float) -> bool:
    """``Group.end``, then forget the group's record: how every op, runner and service group
    the agent started is finished. Cancelled during the grace period (the agent is shutting
    down), the group is killed at once: a record is never removed while its group may still
    run, and never left behind for a group that is gone. Returns ``Group.end``'s answer
    (True: it had to kill)."""
    try:
        return await group.end(grace_s)
    except asyncio.CancelledError:
        group.kill()
        raise
    finally:
        if registry is not None:
            registry.remove(group)
