"""Running services stay known: their ``fingerprint`` again every ``--refresh-s`` (default 20,
as upstream) and once right after each becomes ready.

A fingerprint is where a service says its health and its pool counts (contract 1.6, 2). A
service the agent runs can change either while it runs (a model that loaded fewer slots, a
health that went bad), and nothing else tells the agent: without this its pools would be those
of its last start. Each refresh goes through ``Supervisor.fingerprint``, whose capacity
callbacks give admission the new counts at once (more tokens admit waiting jobs now; fewer
admit nothing more until jobs give theirs back; an unhealthy service offers none).

``manual`` services have their own period (``manualwatch.py``, ``--manual-refresh-s``); a
service with an effect in flight (starting, stopping, failing) is left to that effect, which
fingerprints it itself when it is over. Which services are due is the pure ``due``.

Every round also runs ``also`` (the agent: each runner's ``doctor --json``, runnerhealth.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING

from oarbank_agent.eventwait import wait_event
from oarbank_agent.services import lifecycle as lc

if TYPE_CHECKING:
    from oarbank_agent.services.runtime import ServiceRuntime
    from oarbank_agent.services.supervisor import Supervisor

__all__ = ["DEFAULT_INTERVAL_S", "Refresher", "due"]

log = logging.getLogger("oarbank_agent.services.runningwatch")

DEFAULT_INTERVAL_S = 20.0


def due(services: Iterable[tuple[str, lc.State, str, bool]]) -> list[str]:
    """Of ``(key, state, lifecycle, busy)``, the services whose fingerprint is asked now:
    ready, run by the agent (not ``manual``), no effect of theirs in flight."""
    return [key for key, state, lifecycle, busy in services
            if state is lc.State.READY and lifecycle != "manual" and not busy]


class Refresher:
    """The refresh task: every ``interval_s`` each due service, and a service that just became
    ready at once (``Supervisor.on_change`` tells it)."""

    def __init__(self, sup: Supervisor, interval_s: float,
                 also: Callable[[], Awaitable[None]] | None = None) -> None:
        self.sup = sup
        self.interval_s = interval_s
        self.also = also  # run once every round (every interval_s)
        self._seen_ready: dict[str, float | None] = {}  # key -> the READY it was refreshed for
        self._soon: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        sup.on_change.append(self._changed)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="fingerprint refresh")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _changed(self, key: str) -> None:
        rt = self.sup.services.get(key)
        if rt is None:  # its module was removed (module remove)
            self._seen_ready.pop(key, None)
            return
        if rt.st.state is lc.State.READY and self._seen_ready.get(key) != rt.ready_at:
            # a new READY (a start, a restart, an adoption): its counts as of now, not as of
            # the fingerprint taken while it was stopped
            self._seen_ready[key] = rt.ready_at
            self._soon.add(key)
            self._wake.set()

    async def _loop(self) -> None:
        next_all = time.monotonic() + self.interval_s
        while True:
            await wait_event(self._wake, max(0.0, next_all - time.monotonic()))
            self._wake.clear()
            wanted = set(self._soon)
            self._soon.clear()
            every = time.monotonic() >= next_all
            if every:
                wanted |= set(self.sup.services)
                next_all = time.monotonic() + self.interval_s
            # (a service whose module was removed meanwhile is no longer asked)
            for key in due(self._row(k) for k in sorted(wanted) if k in self.sup.services):
                rt = self.sup.services.get(key)
                if self.sup.shutting_down:
                    return
                if rt is None:
                    continue
                try:
                    await self.sup.fingerprint(rt)
                except Exception:  # a bug here must not end the refreshes for good
                    log.exception("%s: refreshing its fingerprint failed", key)
            if every and self.also is not None and not self.sup.shutting_down:
                try:
                    await self.also()
                except Exception:
                    log.exception("the refresh round's other checks failed")

    def _row(self, key: str) -> tuple[str, lc.State, str, bool]:
        rt: ServiceRuntime = self.sup.services[key]
        return key, rt.st.state, rt.svc.lifecycle, rt.busy()
