"""Notice, without polling, that a process group has no live member left.

A running service's daemon is not the agent's child (``start`` left it behind and exited), so
there is no SIGCHLD for it. On Linux a pidfd (``os.pidfd_open``) becomes readable when its
process exits, child or not: we hold one per live member of the group, and each time one
fires we look at the group again (a member may have forked a new one meanwhile). The group
is gone when a look finds no live member. Where pidfds do not exist (macOS, old kernels) the
fallback looks every ``poll_s`` seconds: the only poll, and only there.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from . import procs

__all__ = ["wait_group_gone", "members"]


def members(pgid: int) -> list[int]:
    """Live (non-zombie) members of process group ``pgid``."""
    return procs._members(pgid)


async def wait_group_gone(pgid: int, *, poll_s: float = 2.0) -> None:
    """Return once process group ``pgid`` has no live member. Cancellable; never raises
    for the group's own doings. Every pidfd it opens is closed on every path."""
    loop = asyncio.get_running_loop()
    watched: dict[int, int] = {}  # pid -> pidfd
    try:
        while True:
            live = set(members(pgid))
            if not live:
                return
            for pid in list(watched):
                if pid not in live:
                    os.close(watched.pop(pid))
            for pid in live - set(watched):
                try:
                    watched[pid] = os.pidfd_open(pid)  # close-on-exec by the kernel's rule
                except ProcessLookupError:
                    continue  # exited between the look and the open
                except (AttributeError, OSError):
                    break  # no pidfds here: fall back to looking now and then
            if not watched:
                await asyncio.sleep(poll_s)
                continue
            fired: asyncio.Future[None] = loop.create_future()

            def on_exit(fut: asyncio.Future[None] = fired) -> None:
                if not fut.done():
                    fut.set_result(None)

            for fd in watched.values():
                loop.add_reader(fd, on_exit)
            try:
                await fired
            finally:
                for fd in watched.values():
                    loop.remove_reader(fd)
    finally:
        for fd in watched.values():
            with contextlib.suppress(OSError):
                os.close(fd)
