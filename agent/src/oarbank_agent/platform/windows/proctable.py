"""The process table on Windows: psutil's (its Windows wheel), for start times, resident
memory and command lines; a group's members come from its job object, not from here.

Under Wine psutil cannot read a process's ``name()`` or ``exe()`` (NtQuerySystemInformation
refuses the class), reports every ``ppid()`` as 0 and ``num_handles()`` as 0: nothing here
uses them.
"""

from __future__ import annotations

import psutil

__all__ = ["started_ms", "is_running", "rss", "cmdline"]


def started_ms(pid: int) -> int | None:
    """When ``pid`` started, in milliseconds since the epoch; None once it is gone."""
    try:
        return int(psutil.Process(pid).create_time() * 1000)
    except (psutil.Error, OSError):
        return None


def is_running(pid: int, started: int | None) -> bool:
    """Whether ``pid`` runs and is the process that started at ``started`` (ms; None: any)."""
    now = started_ms(pid)
    return now is not None and (started is None or now == started)


def rss(pids: list[int]) -> int:
    """Resident bytes of ``pids`` together (those gone meanwhile count 0)."""
    total = 0
    for pid in pids:
        try:
            total += int(psutil.Process(pid).memory_info().rss)
        except (psutil.Error, OSError):
            continue
    return total


def cmdline(pid: int) -> bytes | None:
    """``pid``'s command line, NUL-separated, None when it is gone or cannot be read."""
    try:
        return b"".join(a.encode() + b"\0" for a in psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return None
