"""Memory as the host reports it: what is available now and the total (``psutil``, on every
system).

Host protection (``guard``) samples ``available_fraction`` every few seconds (what each group
holds resident is the platform backend's: ``Groups.resident``); the node's memory budget starts
from ``total_bytes``.
"""

from __future__ import annotations

import psutil

__all__ = ["available_fraction", "total_bytes"]


def available_fraction() -> float:
    """Available memory over total memory, now (1.0 when the total is unknown)."""
    vm = psutil.virtual_memory()
    return vm.available / vm.total if vm.total else 1.0


def total_bytes() -> int:
    """The host's physical memory."""
    return int(psutil.virtual_memory().total)
