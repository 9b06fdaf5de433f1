"""The leases of the portal jobs this node holds (contract 10.6): renewed together every
``renew_s``, stopped at once when the portal says they are lost, handed back when refused.

- Held: every portal job of the node not final yet (queued here, admitted or running), its
  record on disk with its grant; after a restart the records say what the node holds, and
  the first renew goes out at once.
- ``POST /v1/agent/renew`` every ``renew_s`` (the claim answer's; 20 s before one), one call
  for all, while the node holds any (from the first grant after none: ``renew_s`` later). A
  renew that fails is tried again sooner (a quarter of ``renew_s``, jittered): the lease is
  three renews long.
- ``lost``: the attempt is ended here (its runner's group killed, ``cancelled``, final) and
  nothing is reported: the portal has queued the job again, granted it elsewhere, or its
  submitter cancelled it. The reason stays in the record (``portal.report``: ``lost: ...``).
- ``release``: ``POST /v1/agent/release`` for a grant the node will not run; tried a few
  times, then left to expire (the portal queues it again either way).
- ``hand_back``: the portal jobs a stopping node did not finish (its drain over: queued,
  or interrupted and requeued) are released, so the portal queues them again at once, not a
  lease later. Once the portal answers (released, or no longer this node's), the
  record ends here ``cancelled`` (``portal.report``: ``released: ...`` or ``lost: ...``): no
  later agent on this state dir runs it. A release that gets no answer leaves the record as
  it was: the next agent renews and runs it, or the lease expires.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from oarbank_agent.jobs import machine as jobs
from oarbank_agent.reporting.portalhttp import Answer, PortalClient, PortalError

from . import answers

if TYPE_CHECKING:
    from oarbank_agent.agent import Agent
    from oarbank_agent.jobs.store import JobRecord

__all__ = ["Leases"]

log = logging.getLogger("oarbank_agent.fleet")

RENEW_S = 20.0
TIMEOUT_S = 10.0
RELEASE_TRIES = 3


class Leases:
    def __init__(self, agent: Agent, client: PortalClient) -> None:
        self.agent = agent
        self.client = client
        self.renew_s = RENEW_S
        self.live: dict[str, JobRecord] = {}  # local job id -> record, a portal job not final
        self._rng = random.Random()
        self._poked = asyncio.Event()
        self._releases: set[asyncio.Task[None]] = set()
        self.renews = 0
        self.lost = 0
        self.released = 0
        self.last_error: str | None = None

    def recover(self) -> None:
        """Agent start: the portal jobs its records hold (renewed at once)."""
        for rec in self.agent.jobs.values():
            if rec.portal is not None and rec.state not in jobs.TERMINAL:
                self.live[rec.job_id] = rec
        if self.live:
            log.info("fleet: %d portal job(s) held from before the restart: renewing their "
                     "leases", len(self.live))

    def held(self, rec: JobRecord) -> None:
        self.live[rec.job_id] = rec
        self._poked.set()

    def final(self, rec: JobRecord) -> None:
        self.live.pop(rec.job_id, None)

    def body(self) -> dict[str, object]:
        return {"node_id": self.agent.node.node_id,
                "attempts": [{"attempt_id": r.portal["attempt_id"],
                              "generation": r.portal["generation"]}
                             for r in self.live.values() if r.portal is not None]}

    async def run(self) -> None:
        wait = 0.0  # what a restart holds is renewed at once
        while True:
            if not self.live:  # nothing held: the next grant's lease is lease_s from now
                self._poked.clear()
                await self._poked.wait()
                wait = self.renew_s
            if wait > 0:
                await asyncio.sleep(wait)
            wait = self.renew_s
            if not self.live:
                continue
            ans: Answer | None = None
            error: str | None = None
            try:
                ans = await self.client.post("/v1/agent/renew", json.dumps(self.body()).encode(),
                                             TIMEOUT_S, max_reply=4 * 2**20)
            except (OSError, PortalError, asyncio.TimeoutError) as e:
                error = str(e) or type(e).__name__
            else:
                if ans.status != 200:
                    error = f"HTTP {ans.status}: {answers.error_of(ans.body)}"
            if error is not None:
                if self.last_error is None:
                    log.warning("fleet: renewing %d lease(s) at %s failed: %s; tried again "
                                "sooner", len(self.live), self.client.url.text, error)
                self.last_error = error
                wait = self.renew_s / 4 * (1.0 + 0.5 * self._rng.random())
                continue
            assert ans is not None
            if self.last_error is not None:
                log.info("fleet: leases renewed again")
            self.renews += 1
            self.last_error = None
            try:
                doc = json.loads(ans.body)
            except ValueError:
                doc = None
            self.stop_lost(answers.read_lost(doc))

    def stop_lost(self, lost: dict[int, str]) -> None:
        """The attempts the portal no longer gives this node: ended here, not reported."""
        for rec in list(self.live.values()):
            portal = rec.portal
            why = lost.get(portal["attempt_id"]) if portal is not None else None
            if portal is None or why is None:
                continue
            self.lost += 1
            portal["report"] = f"lost: {why}"
            log.warning("fleet: job %s (portal job %s, attempt %s) lost its lease: %s; its "
                        "attempt is ended, nothing is reported", rec.job_id, portal["job_id"],
                        portal["attempt_id"], why)
            self.live.pop(rec.job_id, None)
            if not self.agent.queue.cancel(rec.job_id, f"portal: {why}"):
                self.agent.store.save(rec)  # (final already: only the report's note)

    def release(self, attempt_id: int, generation: int, reason: str,
                answered: Callable[[str], None] | None = None) -> asyncio.Task[None]:
        """Hand a grant back (in the background, a few tries). ``answered`` hears the portal's
        word once it gives one: ``released``, or why the attempt is no longer this node's."""
        task = asyncio.ensure_future(self._release(attempt_id, generation, reason, answered))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)
        return task

    async def _release(self, attempt_id: int, generation: int, reason: str,
                       answered: Callable[[str], None] | None) -> None:
        body = json.dumps({"node_id": self.agent.node.node_id, "attempt_id": attempt_id,
                           "generation": generation, "reason": reason[:200]}).encode()
        wait = None
        for _ in range(RELEASE_TRIES):
            try:
                ans = await self.client.post("/v1/agent/release", body, TIMEOUT_S)
            except (OSError, PortalError, asyncio.TimeoutError) as e:
                error = str(e) or type(e).__name__
            else:
                verdict = answers.result_verdict(ans.status, ans.body)
                if verdict.outcome != "retry":
                    self.released += verdict.outcome == "accepted"
                    if answered is not None:
                        answered("released" if verdict.outcome == "accepted" else verdict.why)
                    return
                error = verdict.why
            pause, wait = answers.backoff(wait, self._rng)
            log.debug("fleet: releasing attempt %d failed: %s", attempt_id, error)
            await asyncio.sleep(pause)
        log.warning("fleet: attempt %d could not be handed back (%s); its lease expires on the "
                    "portal instead", attempt_id, error)

    def hand_back(self, recs: Iterable[JobRecord], reason: str) -> list[asyncio.Task[None]]:
        """The node stops: these portal jobs will not be finished here. Each is released; the
        portal's answer ends its record here (``_handed_back``). Returns the releases, each
        done once answered or given up (its lease expires instead)."""
        return [self.release(rec.portal["attempt_id"], rec.portal["generation"], reason,
                             functools.partial(self._handed_back, rec, reason))
                for rec in recs if rec.portal is not None and rec.state not in jobs.TERMINAL]

    def _handed_back(self, rec: JobRecord, reason: str, answer: str) -> None:
        portal = rec.portal
        if portal is None or rec.state in jobs.TERMINAL:
            return
        portal["report"] = f"released: {reason}" if answer == "released" else f"lost: {answer}"
        self.live.pop(rec.job_id, None)
        # queued -> cancelled: the portal runs it elsewhere; nothing is reported
        if not self.agent.queue.cancel(rec.job_id, f"portal: {portal['report']}"):
            self.agent.store.save(rec)

    async def aclose(self) -> None:
        for t in list(self._releases):
            t.cancel()
        await asyncio.gather(*self._releases, return_exceptions=True)

    def status(self) -> dict[str, object]:
        return {"held": len(self.live), "renews": self.renews, "lost": self.lost,
                "released": self.released, "renew_s": self.renew_s,
                "last_error": self.last_error}
