"""Results of portal jobs (contract 10.7): each finished portal job's record and result
envelope, posted until the portal acknowledges or refuses it.

- Reported: a portal job that ended ``succeeded`` or ``failed`` here (a ``cancelled`` one
  lost its lease: nothing to report). The body is built once, from the record on disk, so a
  retry sends the same bytes; results are idempotent by attempt on the portal.
- ``accepted``, or ``refused`` (409 ``lease_lost`` / ``stale_generation`` / ``cancelled`` /
  ``not_your_attempt``; a 400 or 413 the same body would get again): written into the record
  (``portal.report``), so a restart reports only what is still owed; a refusal is logged with
  its reason and dropped (another node's result stands).
- Anything else (503 with Retry-After, the portal away, a timeout): tried again, jittered,
  doubling up to 30 s, ``PARALLEL`` posts at a time.
- A body over the portal's 1 MiB: the result is left out (null) and the record says so
  (``result_omitted``), the job's state stands.
- Carried by a claim (contract 10.4): a result owed when the claimer sends a claim rides in
  it (``take``; at most ``CARRY_MAX``, small ones: ``CARRY_BYTES`` in all), and the claim's
  answer settles it as a post's would (``settle``); a claim that fails, or a portal that
  answers nothing of them, gives them back to be posted alone. A new result waits
  ``CARRY_WAIT_S`` before it is posted alone: a job's end frees room, so a claim usually
  follows at once and carries it (one request, and one write on the portal, where there were
  two).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
from typing import TYPE_CHECKING, Any

from oarbank_agent.reporting.alive import retry_after_s
from oarbank_agent.reporting.portalhttp import PortalClient, PortalError

from . import answers

if TYPE_CHECKING:
    from oarbank_agent.agent import Agent
    from oarbank_agent.jobs.store import JobRecord

__all__ = ["Results", "result_body"]

log = logging.getLogger("oarbank_agent.fleet")

MAX_BODY = 2**20  # the portal's limit on a result (contract 10.7)
PARALLEL = 8
CARRY_MAX = 64  # the most results a claim carries (the portal's MAX_CLAIM_RESULTS)
CARRY_BYTES = 256 * 1024  # in all, so that a claim stays far below the portal's 1 MiB
CARRY_WAIT_S = 0.05
TIMEOUT_S = 15.0
REPORTED = ("succeeded", "failed")


def result_body(node_id: str, rec: JobRecord) -> bytes:
    """The result of ``rec`` (a portal job), as posted (pure)."""
    assert rec.portal is not None
    record: dict[str, Any] = rec.summary()
    record.pop("portal", None)
    doc = {"node_id": node_id, "attempt_id": rec.portal["attempt_id"],
           "generation": rec.portal["generation"], "record": record, "result": rec.result}
    body = json.dumps(doc, separators=(",", ":")).encode()
    if len(body) > MAX_BODY:
        record["result_omitted"] = (f"the result envelope made the report {len(body)} bytes, "
                                    f"over the portal's {MAX_BODY}")
        doc["result"] = None
        body = json.dumps(doc, separators=(",", ":")).encode()
    return body


class Results:
    def __init__(self, agent: Agent, client: PortalClient) -> None:
        self.agent = agent
        self.client = client
        self._owed: dict[str, JobRecord] = {}  # local job id -> a portal job to report
        self._more = asyncio.Event()
        self._sending: dict[str, asyncio.Task[None]] = {}
        self._carried: set[str] = set()  # local job ids riding in the claim in flight
        self.carry = True  # off once the portal answers a claim's results with nothing
        self.carried = 0  # results settled by a claim's answer
        self._rng = random.Random()
        self.accepted = 0
        self.refused: dict[str, int] = {}  # reason -> count
        self.retries = 0
        self.last_error: str | None = None

    def recover(self) -> None:
        """Agent start: what finished before the restart and was not acknowledged."""
        for rec in self.agent.jobs.values():
            self.final(rec)

    def final(self, rec: JobRecord) -> None:
        if (rec.portal is not None and rec.portal.get("report") is None
                and rec.state in REPORTED):
            self._owed[rec.job_id] = rec
            self._more.set()

    @property
    def owed(self) -> int:
        return len(self._owed)

    async def run(self) -> None:
        try:
            while True:
                await self._more.wait()
                if self.carry:  # a claim may carry them meanwhile (take)
                    await asyncio.sleep(CARRY_WAIT_S)
                self._more.clear()
                for job_id, rec in list(self._owed.items()):
                    if (job_id not in self._sending and job_id not in self._carried
                            and len(self._sending) < PARALLEL):
                        self._sending[job_id] = asyncio.ensure_future(self._report(rec))
                        self._sending[job_id].add_done_callback(functools.partial(
                            self._sent, job_id))
        finally:
            for task in self._sending.values():
                task.cancel()  # what is still owed is on disk: the next agent reports it
            await asyncio.gather(*self._sending.values(), return_exceptions=True)

    def _sent(self, job_id: str, _task: object) -> None:
        self._sending.pop(job_id, None)
        self._more.set()

    def take(self) -> list[tuple[JobRecord, bytes]]:
        """Results owed and not being posted, for the claim about to be sent: each with its
        body; they are the claim's until ``settle`` or ``give_back``."""
        if not self.carry:
            return []
        out: list[tuple[JobRecord, bytes]] = []
        size = 0
        for job_id, rec in self._owed.items():
            if job_id in self._sending or job_id in self._carried:
                continue
            body = result_body(self.agent.node.node_id, rec)
            if size + len(body) > CARRY_BYTES:
                continue  # (a large one is posted alone)
            out.append((rec, body))
            size += len(body)
            self._carried.add(job_id)
            if len(out) == CARRY_MAX:
                break
        return out

    def give_back(self, carried: list[tuple[JobRecord, bytes]]) -> None:
        """The claim did not settle them: posted alone (the same bodies: replays are safe)."""
        for rec, _ in carried:
            self._carried.discard(rec.job_id)
        if carried:
            self._more.set()

    def stop_carrying(self, why: str) -> None:
        """A portal that does not take results with claims (one written before they could):
        each is posted alone from now on."""
        if self.carry:
            self.carry = False
            log.warning("fleet: %s does not take results with claims (%s); each is posted "
                        "alone from now on", self.client.url.text, why)

    def settle(self, carried: list[tuple[JobRecord, bytes]], doc: object) -> None:
        """The claim's answer (its parsed document) for the results it carried."""
        if not carried:
            return
        verdicts = answers.carried_verdicts(doc, len(carried))
        if verdicts is None:
            self.stop_carrying("its answer says nothing of them")
            self.give_back(carried)
            return
        again = []
        for (rec, body), verdict in zip(carried, verdicts, strict=True):
            if verdict.outcome == "retry":
                again.append((rec, body))
            else:
                self._carried.discard(rec.job_id)
                self.carried += 1
                self._settled(rec, verdict)
        self.give_back(again)

    async def _report(self, rec: JobRecord) -> None:
        assert rec.portal is not None
        body = result_body(self.agent.node.node_id, rec)
        wait: float | None = None
        while True:
            retry_after = None
            try:
                ans = await self.client.post("/v1/agent/result", body, TIMEOUT_S)
            except (OSError, PortalError, asyncio.TimeoutError) as e:
                verdict = answers.Verdict("retry", str(e) or type(e).__name__)
            else:
                verdict = answers.result_verdict(ans.status, ans.body)
                retry_after = ans.retry_after if ans.status in (429, 503) else None
            if verdict.outcome != "retry":
                break
            self.retries += 1
            pause = retry_after_s(retry_after, self._rng)
            if pause is None:
                pause, wait = answers.backoff(wait, self._rng)
            if self.last_error is None:
                log.warning("fleet: the result of job %s (portal job %s) did not reach %s: "
                            "%s; sent again until it does", rec.job_id, rec.portal["job_id"],
                            self.client.url.text, verdict.why)
            self.last_error = verdict.why
            await asyncio.sleep(pause)
        self.last_error = None
        self._settled(rec, verdict)

    def _settled(self, rec: JobRecord, verdict: answers.Verdict) -> None:
        """Accepted or refused: written into its record; nothing more is owed."""
        assert rec.portal is not None
        if verdict.outcome == "accepted":
            self.accepted += 1
            rec.portal["report"] = "accepted"
        else:
            self.refused[verdict.why] = self.refused.get(verdict.why, 0) + 1
            rec.portal["report"] = f"refused: {verdict.why}"
            log.warning("fleet: the portal refused the result of job %s (portal job %s, "
                        "attempt %s): %s; dropped", rec.job_id, rec.portal["job_id"],
                        rec.portal["attempt_id"], verdict.why)
        self._owed.pop(rec.job_id, None)
        self.agent.store.save(rec)

    def status(self) -> dict[str, object]:
        return {"owed": len(self._owed), "accepted": self.accepted, "carried": self.carried,
                "refused": dict(self.refused), "retries": self.retries,
                "last_error": self.last_error}
