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
from typing import Any

import psutil

__all__ = ["GroupRecord", "ProcessRegistry", "spawn", "group_alive", "end_group",
           "signal_group", "launch_argv"]


def launch_argv(argv: list[str]) -> list[str]:
    """The hook every op and runner argv goes through before it is executed.

    Identity for now; the sandbox launcher plugs in here (prefixing its wrapper), so that one
    function decides how every child of the agent is confined.
    """
    return list(argv)


@dataclass(frozen=True)
class GroupRecord:
    pgid: int
    kind: str  # op | service | runner
    label: str  # e.g. "dev.example.modelserver/model start" or an attempt id
    started: float  # unix time, to tell a reused pgid from ours


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
                out.append(GroupRecord(int(d["pgid"]), str(d["kind"]), str(d["label"]),
                                       float(d["started"])))
            except (OSError, ValueError, KeyError, TypeError):
                p.unlink(missing_ok=True)  # a torn record: nothing we could act on safely
        return out

    async def end_leftovers(self, grace_s: float = 2.0) -> list[GroupRecord]:
        """End every recorded group that still has members started by us; clear the records."""
        ended = []
        for rec in self.records():
            if _members(rec.pgid, not_before=rec.started - 1.0):
                ended.append(rec)
                await end_group(rec.pgid, grace_s, not_before=rec.started - 1.0)
            self.remove(rec.pgid)
        return ended


async def spawn(argv: list[str], *, env: dict[str, str], cwd: str | os.PathLike[str],
                stdout: Any, stderr: Any, pass_fds: tuple[int, ...] = (),
                registry: ProcessRegistry | None = None, kind: str = "op",
                label: str = "") -> asyncio.subprocess.Process:
    """Start ``argv`` in a new session with exactly ``env``; record its group.

    Only the descriptors in ``pass_fds`` (plus stdin/stdout/stderr) reach the child.
    Raises ``OSError`` if it cannot be started.
    """
    proc = await asyncio.create_subprocess_exec(
        *launch_argv(argv), env=env, cwd=str(cwd), stdin=asyncio.subprocess.DEVNULL,
        stdout=stdout, stderr=stderr, pass_fds=pass_fds, close_fds=True,
        start_new_session=True,
    )
    if registry is not None:
        # The record lands right after the fork; a crash in between leaves a group whose
        # leader is our direct child, which dies with... nothing: accepted, the window is tiny.
        registry.add(GroupRecord(proc.pid, kind, label, time.time()))
    return proc


def _members(pgid: int, not_before: float | None = None) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    pids = []
    for pid, pgrp, state in _proc_table():
        if pgrp != pgid or state == "Z":
            continue
        if not_before is not None:
            try:
                if psutil.Process(pid).create_time() < not_before:
                    continue  # a reused pgid: not ours
            except psutil.Error:
                continue
        pids.append(pid)
    return pids


def _proc_table() -> list[tuple[int, int, str]]:
    """(pid, pgid, state letter) of every process, read straight from /proc (cheap)."""
    if not os.path.isdir("/proc/self"):  # pragma: no cover - macOS: psutil's slower scan
        out = []
        for p in psutil.process_iter(["pid", "status"]):
            try:
                z = "Z" if p.info["status"] == psutil.STATUS_ZOMBIE else "R"
                out.append((p.pid, os.getpgid(p.pid), z))
            except (OSError, psutil.Error):
                continue
        return out
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        if len(rest) < 3:
            continue
        out.append((int(name), int(rest[2]), rest[0].decode()))
    return out


def group_alive(pgid: int) -> bool:
    return bool(_members(pgid))


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def end_group(pgid: int, grace_s: float, *, not_before: float | None = None) -> bool:
    """SIGTERM the group, wait up to ``grace_s`` for it to empty, then SIGKILL.

    Returns True if it had to SIGKILL. Safe on a group that is already gone.
    """
    if not _members(pgid, not_before):
        return False
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    delay = 0.01
    while time.monotonic() < deadline:
        if not _members(pgid, not_before):
            return False
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.2)
    signal_group(pgid, signal.SIGKILL)
    # SIGKILL cannot be refused; give the kernel a moment to tear the members down.
    for _ in range(50):
        if not _members(pgid, not_before):
            break
        await asyncio.sleep(0.02)
    return True
