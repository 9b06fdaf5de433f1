"""The claim loop (contract 10.4): one long-polled ``POST /v1/agent/claim`` at a time, sent
only while the node has room (``offer.room``); each grant becomes a local job.

    wait for room --> claim (wait_s) --> grants run as jobs --> claim again at once
         ^                |
         |   refused / away: back off (jittered; Retry-After when the portal says)
         +--- a change: an admission pass, a service's state or capacity (``poke``)

- A grant goes through the agent's own ``submit`` (the local queue, admission, its record on
  disk with the grant: ``JobRecord.portal``) before the next claim, so the room the next one
  offers already counts it. A grant the node refuses (its runner undetected, a memory budget
  it can never fit, the module gone since the claim) is handed back at once
  (``Leases.release``).
- The agent stopping ends the loop: a claim in flight gets ``dispatch.STOP_GRACE_S`` to be
  answered, and the grants it brings are handed back; a long poll still held then is
  cancelled (its connection closed: the portal grants nothing to it from then on).
- Memory is not an event: with no room, the node looks again every ``RECHECK_S`` at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from typing import TYPE_CHECKING

from oarbank_agent.operate import control
from oarbank_agent.reporting.alive import retry_after_s
from oarbank_agent.reporting.portalhttp import PortalClient, PortalError

from . import answers, offer, snapshot

if TYPE_CHECKING:
    from oarbank_agent.agent import Agent

    from .leases import Leases
    from .results import Results

__all__ = ["Claimer"]

log = logging.getLogger("oarbank_agent.fleet")

RECHECK_S = 5.0
_REPLY_PER_GRANT = 80 * 1024  # a grant: its payload (64 KiB at most) and its fields


class Claimer:
    def __init__(self, agent: Agent, client: PortalClient, leases: Leases, results: Results,
                 times: offer.JobTimes, *, wait_s: float = 20.0) -> None:
        self.agent = agent
        self.client = client
        self.leases = leases
        self.results = results  # what a claim carries (results.py: take, settle)
        self.times = times
        self.wait_s = wait_s
        self._changed = asyncio.Event()
        self._rng = random.Random()
        self._backoff: float | None = None
        self.claims = 0  # claims answered 200
        self.granted = 0  # grants taken as local jobs
        self.refused_grants = 0  # grants handed back at once
        self.last_error: str | None = None
        self._warned: set[str] = set()

    def poke(self, *_: object) -> None:
        """Something changed that may give the node room (any caller on the loop)."""
        self._changed.set()

    async def run(self) -> None:
        while not self.agent.stopping():
            self._changed.clear()
            view = snapshot.node_view(self.agent, self.times)
            n = offer.room(view)
            if n <= 0:
                await self._wait(RECHECK_S)
                continue
            carried = self.results.take()
            body = offer.claim_bytes(offer.claim_body(view, self.wait_s, n),
                                     [b for _, b in carried])
            try:
                ans = await self.client.post("/v1/agent/claim", body, self.wait_s + 10.0,
                                             max_reply=64 * 1024 + n * _REPLY_PER_GRANT
                                             + len(carried) * 1024)
            except (OSError, PortalError, asyncio.TimeoutError) as e:
                self.results.give_back(carried)
                await self._failed(str(e) or type(e).__name__, None)
                continue
            if ans.status != 200:
                self.results.give_back(carried)
                if ans.status == 400 and carried:  # a portal that refuses the key itself
                    self.results.stop_carrying(f"HTTP 400: {answers.error_of(ans.body)}")
                    continue  # claimed again at once, without them
                await self._failed(f"HTTP {ans.status}: {answers.error_of(ans.body)}",
                                   ans.retry_after if ans.status in (429, 503) else None)
                continue
            self._backoff = self.last_error = None
            self.claims += 1
            try:
                doc = json.loads(ans.body)
            except ValueError:
                doc = None
            self.results.settle(carried, doc)
            grants, problems, renew_s = answers.read_grants(doc)
            for p in problems:
                log.warning("claim: the portal's answer held something not a grant, skipped "
                            "(its lease ends on the portal): %s", p)
            if renew_s is not None:
                self.leases.renew_s = renew_s
            for g in grants:
                self._take(g)

    def _take(self, g: answers.Grant) -> None:
        """A grant becomes a local job, on disk with its attempt and generation."""
        if self.agent.stopping():  # (a long poll answered as the drain began)
            self.refused_grants += 1
            self.leases.release(g.attempt_id, g.generation, "the agent is stopping")
            return
        try:
            rec = self.agent.submit(g.module, g.stage, g.payload, g.portal())
        except control.ControlError as e:
            self.refused_grants += 1
            log.warning("claim: grant %d (job %s of %s/%s) refused here: %s: %s; handed back",
                        g.attempt_id, g.job_id, g.module, g.stage, e.code, e)
            self.leases.release(g.attempt_id, g.generation, f"{e.code}: {e}")
            return
        self.granted += 1
        self.leases.held(rec)
        log.info("claim: job %s (attempt %d, generation %d, placement %s) runs here as %s",
                 g.job_id, g.attempt_id, g.generation, g.placement, rec.job_id)

    async def _failed(self, error: str, retry_after: str | None) -> None:
        hold = retry_after_s(retry_after, self._rng)
        if hold is None:
            hold, self._backoff = answers.backoff(self._backoff, self._rng)
        cause = error.split(":", 1)[0]
        if cause not in self._warned:  # each cause once; the rest at debug
            self._warned.add(cause)
            log.warning("claim: portal %s: %s; the next claim in %.1f s", self.client.url.text,
                        error, hold)
        else:
            log.debug("claim: %s; the next claim in %.1f s", error, hold)
        self.last_error = error
        await self._wait(hold, changes=False)

    async def _wait(self, seconds: float, *, changes: bool = True) -> None:
        """``seconds``, or less when a change comes first (``changes``) or the agent stops."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            waiter = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait({waiter}, timeout=left)
            finally:
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waiter
            if self._changed.is_set() and (changes or self.agent.stopping()):
                return
            self._changed.clear()

    def status(self) -> dict[str, object]:
        return {"claims": self.claims, "granted": self.granted,
                "refused_grants": self.refused_grants, "last_error": self.last_error}
