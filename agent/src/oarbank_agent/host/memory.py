"""Memory as the host reports it: what is available now, the total, and what each process
group holds resident (``psutil`` for the machine, ``/proc/<pid>/statm`` per process).

Host protection (``guard``) samples ``available_fraction`` every few seconds and picks its
hard-floor victim by ``group_rss``; the node's memory budget starts from ``total_bytes``.
"""

from __future__ import annotations

import os

import psutil

from oarbank_agent.host.proctable import proc_table

__all__ = ["available_fraction", "total_bytes", "group_rss"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def available_fraction() -> float:
    """Available memory over total memory, now (1.0 when the total is unknown)."""
    vm = psutil.virtual_memory()
    return vm.available / vm.total if vm.total else 1.0


def total_bytes() -> int:
    """The host's physical memory."""
    return int(psutil.virtual_memory().total)


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
