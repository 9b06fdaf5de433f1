"""pidfds: a descriptor that becomes readable when its process exits, child or not (Linux 5.3+).

Two uses, each with its fallback where pidfds do not exist (macOS, old kernels, a seccomp filter
that refuses ``pidfd_open``):

- ``wait_group_gone(pgid)``: notice, without polling, that a process group has no live member
  left. A running service's daemon is not the agent's child (``start`` left it behind and
  exited), so there is no SIGCHLD for it: we hold one pidfd per live member of the group, and
  each time one fires we look at the group again (a member may have forked a new one
  meanwhile). The group is gone when a look finds no live member. Without pidfds the fallback
  looks every ``poll_s`` seconds: the only poll, and only there.
- ``use_child_watcher(loop)``: reap the agent's children without a thread per child. Before
  Python 3.12 asyncio's default child watcher (``ThreadedChildWatcher``) starts one thread per
  child process, to block in ``waitpid``: every op, runner and ``start`` costs a thread start,
  and the agent's thread count follows its live children. ``PidfdChildWatcher`` waits for all
  children on the loop itself. Python 3.12+ already picks it by default where pidfds work (and
  deprecates setting a watcher), so this only acts on 3.9-3.11; elsewhere the default stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from oarbank_agent.platform.linux.proctable import members

__all__ = ["works", "use_child_watcher", "wait_group_gone"]


def works() -> bool:
    """Whether this process can open a pidfd here."""
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:  # ENOSYS on kernels before 5.3, EPERM under some seccomp filters
        return False
    os.close(fd)
    return True


def use_child_watcher(loop: asyncio.AbstractEventLoop) -> str:
    """Make ``loop`` (running, in the main thread) reap children through pidfds where that is
    possible and not already the default. Returns the watcher in use, for the log."""
    if sys.version_info >= (3, 12) or sys.platform != "linux":
        return "default"
    cls = getattr(asyncio, "PidfdChildWatcher", None)
    if cls is None or not works():
        return "default (no pidfds): a thread per child"
    watcher = cls()
    asyncio.get_event_loop_policy().set_child_watcher(watcher)  # closes the one it replaces
    watcher.attach_loop(loop)
    return "pidfd"


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
