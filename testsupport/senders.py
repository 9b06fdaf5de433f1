"""Running an agent's heartbeat sender (``oarbank_agent.reporting.heartbeat.HeartbeatSender``)
against a real portal until it has been answered."""

from __future__ import annotations

import asyncio
import time
from typing import Any

__all__ = ["until_answered"]


async def until_answered(sender: Any, posts: int, timeout_s: float) -> Any:
    """Start ``sender``, wait until the portal answered ``posts`` of its reports (taken or
    refused) or ``timeout_s`` passed, close it; the sender, for its counts."""
    sender.start()
    deadline = time.monotonic() + timeout_s
    while sender.posts_ok + sender.posts_failed < posts and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await sender.aclose()
    return sender
