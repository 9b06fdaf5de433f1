"""The process factory's host side on Linux: a process's footprint from ``/proc``, a lost
child waited for through a pidfd (it works for a process that is not the agent's child).

Without a pidfd (a kernel before 5.3) the wait polls ``/proc/<pid>`` every 50 ms; a zombie
counts as gone (its parent, the dead factory, will never reap it: init does).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

__all__ = ["LinuxFactoryHost"]


class LinuxFactoryHost:
    """``api.FactoryHost`` over ``/proc`` and pidfds."""

    def client(self, *, confine: bool, backend: Any) -> Any:
        from oarbank_agent.platform.linux.factory.client import FactoryClient

        return FactoryClient(confine=confine, backend=backend)

    def footprint(self, pid: int) -> dict[str, int]:
        rep: dict[str, int] = {}
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/statm") as f:
            rep["rss_bytes"] = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        with contextlib.suppress(OSError):
            rep["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
        return rep

    async def until_gone(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            fd = -1
        if fd >= 0:
            loop = asyncio.get_running_loop()
            gone = loop.create_future()
            loop.add_reader(fd, _set_once, gone)
            try:
                await gone
            finally:
                loop.remove_reader(fd)
                os.close(fd)
        else:
            while os.path.exists(f"/proc/{pid}") and not _zombie(pid):
                await asyncio.sleep(0.05)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rfind(b")") + 2:][:1] == b"Z"
    except OSError:
        return True


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
