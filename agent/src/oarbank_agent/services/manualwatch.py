"""Manual services: fingerprinted again now and then, since nothing else tells us they changed.

A ``manual`` service is never started or stopped by the agent (contract section 2); someone
else runs it, so its token counts and health can change at any time without an event the agent
could see. Every ``interval_s`` seconds (30 s by default; ``oarbank-agent run
--manual-refresh-s`` sets it) each manual service gets its ``fingerprint`` op again, one after
the other; the supervisor's ``fingerprint`` updates its pools and health and tells the agent
(capacity callbacks), so jobs waiting for its tokens are admitted as soon as they appear.

Services the agent runs itself are fingerprinted on their own events (start, stop, failure,
probes of a withdrawn one) and, while ready, every ``--refresh-s`` (``runningwatch.py``). No
task runs here at all when no manual service is loaded.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["DEFAULT_INTERVAL_S", "start", "refresh_loop"]

log = logging.getLogger("oarbank_agent.services.manualwatch")

DEFAULT_INTERVAL_S = 30.0


async def refresh_loop(sup: Supervisor, interval_s: float) -> None:
    """Fingerprint every manual service every ``interval_s`` seconds, until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        for rt in [rt for rt in sup.services.values() if rt.svc.lifecycle == "manual"]:
            if sup.shutting_down:
                return
            try:
                await sup.fingerprint(rt)  # a GPU-less one runs no op (fingerprint says so)
            except Exception:  # a bug here must not end the refreshes for good
                log.exception("%s: refreshing the manual service's fingerprint failed", rt.key)


def start(sup: Supervisor, interval_s: float) -> asyncio.Task[None] | None:
    """The refresh task, or None when no manual service is loaded (nothing to watch)."""
    if not any(rt.svc.lifecycle == "manual" for rt in sup.services.values()):
        return None
    return asyncio.create_task(refresh_loop(sup, interval_s), name="manual refresh")
