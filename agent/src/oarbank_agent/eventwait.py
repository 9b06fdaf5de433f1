"""Waiting on an ``asyncio.Event`` with a timeout, without losing a cancellation.

On Python < 3.12, ``asyncio.wait_for(event.wait(), t)`` swallows a ``cancel()`` that arrives
in the same loop turn as ``event.set()`` (CPython gh-86296): a watcher loop woken and cancelled
together (an attempt ends while the agent shuts down) then runs on, and the ``await`` on its
task never returns. ``asyncio.wait`` reports the cancellation every time. ``result_within``
is the same wait for any awaitable (a process's exit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["result_within", "wait_event"]

T = TypeVar("T")


async def result_within(aw: Awaitable[T], timeout: float | None) -> tuple[bool, T | None]:
    """Await ``aw`` for up to ``timeout`` seconds (None: no limit): (True, its result), or
    (False, None) with ``aw`` cancelled. A cancel of the caller is never lost. As
    ``wait_for``, ``aw`` has finished (its own cleanup run) when this returns or raises."""
    waiter = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({waiter}, timeout=timeout)
    finally:
        if not waiter.done():
            waiter.cancel()
            await asyncio.wait({waiter})
    return (True, waiter.result()) if done else (False, None)


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``event``; True if it is set."""
    return (await result_within(event.wait(), timeout))[0]
