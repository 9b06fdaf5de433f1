"""``oarbank-agent run --portal URL --claim``: the node pulls work from the portal (contract
section 10) beside its local ``submit``. This wires the three loops to the agent:

- ``Claimer`` (claims.py): claims while the node has room; grants become local jobs;
- ``Leases`` (leases.py): renews what the node holds, stops what it lost, hands back grants;
- ``Results`` (results.py): reports each finished portal job until acknowledged.

The agent's events drive them: an admission pass and a service change may give room (a
claim); a job that became final is reported, leaves the leases, and adds its run time to the
module's ``job_s``; a stop request ends claiming (the drain runs what is held): a claim
being answered gets ``STOP_GRACE_S`` to bring its grants, which are handed back; a long poll
still held then is dropped, and the portal grants nothing to it. At
the end, the portal jobs the drain did not finish are handed back (the portal grants them
elsewhere at once, not a lease later), and results still owed go out, both within
``FLUSH_S``; what is left is on disk for the next agent on this state dir.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from oarbank_agent.reporting.portalhttp import PortalClient

from .claims import Claimer
from .leases import Leases
from .offer import JobTimes
from .results import Results

if TYPE_CHECKING:
    from oarbank_agent.agent import Agent
    from oarbank_agent.jobs.store import JobRecord

__all__ = ["FleetDispatch"]

log = logging.getLogger("oarbank_agent.fleet")

FLUSH_S = 5.0
STOP_GRACE_S = 1.0  # a claim in flight at a stop: its answer may hold grants to hand back


def run_seconds(rec: JobRecord) -> float | None:
    """The run time of a succeeded job's last attempt (its module's ``job_s``)."""
    last = rec.history[-1] if rec.history else None
    if (rec.state != "succeeded" or last is None or last.get("outcome") != "succeeded"
            or not isinstance(last.get("started_at"), (int, float))
            or not isinstance(last.get("finished_at"), (int, float))):
        return None
    return max(0.0, float(last["finished_at"]) - float(last["started_at"]))


class FleetDispatch:
    def __init__(self, agent: Agent, url: str, *, token: str | None = None,
                 ca_file: str | None = None, wait_s: float = 20.0) -> None:
        self.agent = agent
        self.client = PortalClient(url, token=token, ca_file=ca_file)
        self.times = JobTimes()
        self.leases = Leases(agent, self.client)
        self.results = Results(agent, self.client)
        self.claimer = Claimer(agent, self.client, self.leases, self.results, self.times,
                               wait_s=wait_s)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stop_claims_at: float | None = None  # the stop's grace for a claim in flight
        agent.queue.runs.on_final.append(self._final)
        agent.queue.after_admit.append(self.claimer.poke)
        agent.supervisor.on_change.append(self.claimer.poke)
        agent.on_stop.append(self._stopping)

    def start(self) -> None:
        """On the agent's loop, once it has read its records (its ``ready``)."""
        for rec in self.agent.jobs.values():
            seconds = run_seconds(rec)
            if seconds is not None:
                self.times.add(rec.module, seconds)
        self.leases.recover()
        self.results.recover()
        for name, coro in (("claims", self.claimer.run()), ("leases", self.leases.run()),
                           ("results", self.results.run())):
            self._tasks[name] = asyncio.create_task(coro, name=f"fleet {name}")
            self._tasks[name].add_done_callback(self._ended)
        log.info("fleet: claiming work from %s as node %s", self.client.url.text,
                 self.agent.node.node_id)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            log.error("fleet: %s ended by a bug: %r", task.get_name(), task.exception(),
                      exc_info=task.exception())

    def _final(self, rec: JobRecord) -> None:
        if rec.portal is not None:
            self.leases.final(rec)
            self.results.final(rec)
        seconds = run_seconds(rec)
        if seconds is not None:
            self.times.add(rec.module, seconds)

    def _stopping(self) -> None:
        task = self._tasks.get("claims")
        if task is not None:
            self._stop_claims_at = time.monotonic() + STOP_GRACE_S
            self.claimer.poke()  # one waiting for room sees the stop and ends
            asyncio.get_running_loop().call_later(STOP_GRACE_S, task.cancel)

    async def aclose(self) -> None:
        """The agent has stopped: the portal jobs it did not finish are handed back, and
        results still owed go out, within ``FLUSH_S``; then every loop ends."""
        claims = self._tasks.get("claims")
        if claims is not None and self._stop_claims_at is not None:
            await asyncio.wait({claims}, timeout=max(0.0, self._stop_claims_at
                                                       - time.monotonic()))
        handing: list[asyncio.Task[None]] = []
        if "leases" in self._tasks:
            handing = self.leases.hand_back(list(self.leases.live.values()),
                                            "the agent stopped before running it to the end")
            if handing:
                log.info("fleet: %d portal job(s) the drain did not finish handed back",
                         len(handing))
        deadline = time.monotonic() + FLUSH_S
        while ((self.results.owed and "results" in self._tasks)
               or not all(t.done() for t in handing)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.results.owed:
            log.warning("fleet: %d result(s) not acknowledged yet: the next agent on this "
                        "state dir reports them", self.results.owed)
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
        await self.leases.aclose()

    def status(self) -> dict[str, Any]:
        """For ``oarbank-agent status``."""
        return {"portal": self.client.url.text, "claims": self.claimer.status(),
                "leases": self.leases.status(), "results": self.results.status()}
