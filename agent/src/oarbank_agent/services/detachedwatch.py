"""Watching a running service that left nothing the agent can see: sparse ``status`` polls.

A ready service is normally watched through events: an endpoint service's channel closing, or
its group dying (``Group.wait_gone``). A non-endpoint service whose ``start`` left
nothing in its process group (its daemon detached itself, or runs under another supervisor;
also one adopted without a recorded group) offers neither, so for such services only the agent
asks its ``status`` op now and then: first after ``first_s`` seconds (10 s by default;
``oarbank-agent run --status-poll-s``), the interval doubling up to ``max_s`` (six times the
first) while the answers say it runs. ``running: false`` is a service failure (the restart
policy applies). An op that fails or times out proves nothing either way: it is logged, and
the next ask comes after ``first_s`` again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from oarbank_agent.services.ops import OpResult

__all__ = ["DEFAULT_FIRST_S", "max_interval", "next_interval", "verdict", "watch"]

log = logging.getLogger("oarbank_agent.services.detachedwatch")

DEFAULT_FIRST_S = 10.0


def max_interval(first_s: float) -> float:
    return first_s * 6


def next_interval(current_s: float, first_s: float) -> float:
    """The interval after an answer that says the service runs (doubling, capped)."""
    return min(current_s * 2, max_interval(first_s))


def verdict(res: OpResult) -> str:
    """``running`` / ``stopped`` / ``unknown`` (the op failed or said nothing usable)."""
    if not res.ok or res.doc is None:
        return "unknown"
    running = res.doc.get("running")
    if running is True:
        return "running"
    if running is False:
        return "stopped"
    return "unknown"


async def watch(key: str, ask: Callable[[], Awaitable[OpResult]], first_s: float) -> str:
    """Ask ``status`` sparsely until it says the service is not running; return that as a
    readable failure. Cancellable (the service is being stopped by the agent)."""
    interval = first_s
    while True:
        await asyncio.sleep(interval)
        res = await ask()
        v = verdict(res)
        if v == "stopped":
            return "its status op says it is no longer running"
        if v == "unknown":
            log.warning("%s: status did not answer usably (%s); asking again in %gs", key,
                        res.error or "no 'running' field", first_s)
            interval = first_s
        else:
            interval = next_interval(interval, first_s)
