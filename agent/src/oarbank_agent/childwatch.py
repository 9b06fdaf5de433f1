"""Reap the agent's children without a thread per child.

Before Python 3.12 asyncio's default child watcher (``ThreadedChildWatcher``) starts one
thread per child process, to block in ``waitpid``: every op, runner and ``start`` costs a
thread start, and the agent's thread count follows its live children. On Linux a pidfd
becomes readable when its process exits, so ``PidfdChildWatcher`` waits for all children on
the loop itself. Python 3.12+ already picks it by default where pidfds work (and deprecates
setting a watcher), so this only acts on 3.9-3.11; elsewhere the default stays.
"""

from __future__ import annotations

import asyncio
import os
import sys

__all__ = ["use_pidfd_watcher"]


def _pidfd_works() -> bool:
    if not hasattr(os, "pidfd_open"):
        return False
    try:
        fd = os.pidfd_open(os.getpid())
    except OSError:  # ENOSYS on kernels before 5.3, EPERM under some seccomp filters
        return False
    os.close(fd)
    return True


def use_pidfd_watcher(loop: asyncio.AbstractEventLoop) -> str:
    """Make ``loop`` (running, in the main thread) reap children through pidfds where that is
    possible and not already the default. Returns the watcher in use, for the log."""
    if sys.version_info >= (3, 12) or sys.platform != "linux":
        return "default"
    cls = getattr(asyncio, "PidfdChildWatcher", None)
    if cls is None or not _pidfd_works():
        return "default (no pidfds): a thread per child"
    watcher = cls()
    asyncio.get_event_loop_policy().set_child_watcher(watcher)  # closes the one it replaces
    watcher.attach_loop(loop)
    return "pidfd"
