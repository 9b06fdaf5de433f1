"""The process table on Linux: who is alive, in which process group, since when, and how much
memory each holds (``/proc``).

A process group's members cannot be asked for directly, so ``members`` reads the whole table
once (cheap: one small ``stat`` file per process). Start times (``start_ticks``, clock ticks
since boot) tell a group of ours from a later one that reuses its number; ``boot_id`` tells a
record written before a reboot, whose numbers mean nothing any more.
"""

from __future__ import annotations

import os

__all__ = ["proc_table", "members", "boot_id", "start_ticks", "status", "cmdline", "group_rss"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def proc_table() -> list[tuple[int, int, str, int | None]]:
    """(pid, pgid, state letter, start ticks) of every process, straight from /proc (cheap)."""
    out: list[tuple[int, int, str, int | None]] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        rest = data[data.rfind(b")") + 2 :].split()
        if len(rest) < 20:
            continue
        out.append((int(name), int(rest[2]), rest[0].decode(), int(rest[19])))
    return out


def members(pgid: int, min_ticks: int | None = None,
            table: list[tuple[int, int, str, int | None]] | None = None) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid`` (started at or after ``min_ticks``).
    ``table``: a ``proc_table()`` already read (one read for many groups)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    pids = []
    for pid, pgrp, state, ticks in (proc_table() if table is None else table):
        if pgrp != pgid or state == "Z":
            continue
        if min_ticks is not None and ticks is not None and ticks < min_ticks:
            continue  # started before our leader: a reused pgid, not ours
        pids.append(pid)
    return pids


def boot_id() -> str | None:
    """This boot's id (Linux), or None."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # pragma: no cover - not Linux
        return None


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rfind(b")") + 2 :].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def status(pid: int) -> dict[str, str] | None:
    """``/proc/<pid>/status`` as key -> value (``State``, ``Seccomp``, ``NoNewPrivs``...), or
    None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            text = f.read()
    except OSError:
        return None  # gone
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def cmdline(pid: int) -> bytes | None:
    """``/proc/<pid>/cmdline`` (NUL-separated), or None when the process is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def group_rss(pgids: set[int]) -> dict[int, int]:
    """Resident bytes of every live member of each process group, summed per group (one
    pass over /proc)."""
    out = dict.fromkeys(pgids, 0)
    for pid, pgid, state, _ticks in proc_table():
        if pgid not in out or state == "Z":
            continue
        try:
            with open(f"/proc/{pid}/statm", "rb") as f:
                out[pgid] += int(f.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue  # it exited meanwhile
    return out
