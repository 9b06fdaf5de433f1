"""Waiting on an ``asyncio.Event`` with a timeout, without losing a cancellation.

On Python < 3.12, ``asyncio.wait_for(event.wait(), t)`` swallows a ``cancel()`` that arrives
in the same loop turn as ``event.set()`` (CPython gh-86296): a watcher loop woken and cancelled
together (an attempt ends while the agent shuts down) then runs on, and the ``await`` on its
task never returns. ``asyncio.wait`` reports the cancellation every time.
"""

from __future__ import annotations

import asyncio

__all__ = ["wait_event"]


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; True if it is set."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
    return bool(done)
