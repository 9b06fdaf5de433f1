"""The process factory's host side on Windows: there is no factory (no fork to start
children from a warm image), a process's footprint from psutil, its end waited for on its
process handle.

Under Wine psutil reports 0 open handles for every process, so ``fds`` is left out there.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psutil

from oarbank_agent.platform.windows import jobapi, winapi

__all__ = ["WindowsFactoryHost"]

SYNCHRONIZE = 0x00100000


class WindowsFactoryHost:
    """``api.FactoryHost`` on Windows."""

    def client(self, *, confine: bool, backend: Any) -> Any:
        raise OSError("Windows has no process factory: it has no fork, so children are "
                      "started directly, each into its job object")

    def footprint(self, pid: int) -> dict[str, int]:
        rep: dict[str, int] = {}
        with contextlib.suppress(psutil.Error, OSError):
            proc = psutil.Process(pid)
            rep["rss_bytes"] = int(proc.memory_info().rss)
            if not jobapi.is_wine():
                rep["fds"] = int(proc.num_handles())
        return rep

    async def until_gone(self, pid: int) -> None:
        try:
            process = winapi.open_process(pid, SYNCHRONIZE)
        except OSError:
            return  # no such process (any more)
        try:
            # In slices, so that a cancelled wait leaves its thread within 0.2 s.
            while not await asyncio.to_thread(jobapi.wait_process, process, 200):
                pass
        finally:
            winapi.close(process)
