"""The process factory's host side as POSIX (macOS) gives it: a process's footprint and its
end through psutil, polled (no ``/proc``, no pidfd). The darwin backend has no factory today
(``factory.resolve_mode``); this is what one would be watched with.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psutil

__all__ = ["PosixFactoryHost"]


class PosixFactoryHost:
    """``api.FactoryHost`` over psutil."""

    def client(self, *, confine: bool, backend: Any) -> Any:
        raise OSError("this system has no process factory (it forks under the Linux sandbox)")

    def footprint(self, pid: int) -> dict[str, int]:
        rep: dict[str, int] = {}
        with contextlib.suppress(psutil.Error, OSError):
            proc = psutil.Process(pid)
            rep["rss_bytes"] = int(proc.memory_info().rss)
            rep["fds"] = int(proc.num_fds())
        return rep

    async def until_gone(self, pid: int) -> None:
        while True:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    return
            except psutil.NoSuchProcess:
                return
            except (psutil.Error, OSError):
                if not psutil.pid_exists(pid):
                    return
            await asyncio.sleep(0.05)
