"""The process table where there is no ``/proc`` (macOS): psutil's scan, process groups by
``getpgid``; no start times, no boot id, no kernel status fields.

The same functions as ``platform/linux/proctable.py``, so that ``groups.py`` runs on either.
"""

from __future__ import annotations

import os

import psutil

__all__ = ["proc_table", "members", "boot_id", "start_ticks", "status", "cmdline", "group_rss"]


def proc_table() -> list[tuple[int, int, str, int | None]]:
    """(pid, process group, state letter, None) of every process (psutil's scan)."""
    out: list[tuple[int, int, str, int | None]] = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            z = "Z" if p.info["status"] == psutil.STATUS_ZOMBIE else "R"
            out.append((p.pid, os.getpgid(p.pid), z, None))
        except (OSError, psutil.Error):
            continue
    return out


def members(pgid: int, min_ticks: int | None = None,
            table: list[tuple[int, int, str, int | None]] | None = None) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid`` (``min_ticks`` is never known here).
    ``table``: a ``proc_table()`` already read (one read for many groups)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [pid for pid, pgrp, state, _ticks in (proc_table() if table is None else table)
            if pgrp == pgid and state != "Z"]


def boot_id() -> str | None:
    """None: no boot id here (a record is taken to be of this boot)."""
    return None


def start_ticks(pid: int) -> int | None:
    """None: start ticks are not known here."""
    return None


def status(pid: int) -> dict[str, str] | None:
    """None: there are no kernel status fields to read here."""
    return None


def cmdline(pid: int) -> bytes | None:
    """``pid``'s command line, NUL-separated (psutil), or None when it is gone."""
    try:
        return b"".join(a.encode() + b"\0" for a in psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return None


def group_rss(pgids: set[int]) -> dict[int, int]:
    """Resident bytes of every live member of each process group, summed per group."""
    out = dict.fromkeys(pgids, 0)
    for pid, pgid, state, _ticks in proc_table():
        if pgid not in out or state == "Z":
            continue
        try:
            out[pgid] += int(psutil.Process(pid).memory_info().rss)
        except (psutil.Error, OSError):
            continue  # it exited meanwhile
    return out
