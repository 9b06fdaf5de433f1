"""The dispatch endpoints (contract section 10) behind the portal's front end: credentials,
bodies in, the store's answers out. The ASGI layer (``web/asgi.py``) awaits ``claim`` (a long
poll must not hold one of the request threads) and sends every other dispatch request to
``handle`` in the thread pool.

Routes:
  POST /v1/jobs                      submit one job or a batch (submitter token)
  GET  /v1/jobs?batch=B[&state=][&after=][&limit=]    a batch's records, paged
  GET  /v1/jobs/<job_id>             a job's record
  POST /v1/jobs/<job_id>/cancel      cancel it
  GET  /v1/batches/<batch_id>        a batch's counts, by state and by node
  POST /v1/batches/<batch_id>/cancel cancel what of it is queued or running
  POST /v1/agent/claim               a node asks for work (node token; long-polled)
  POST /v1/agent/renew               a node extends its attempts' leases
  POST /v1/agent/result              a node's result for an attempt
  POST /v1/agent/release             a node hands a granted job back
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

from ..store.group_commit import GroupCommit
from ..store.tokens import bearer_token, token_hash
from . import offers, placement
from .catalogue import Catalogue
from .claims import Claimed, Claims, ClaimWork
from .protocol import (
    BadRequest,
    Claim,
    Result,
    attempt_refs,
    read_claim,
    read_release,
    read_result,
    read_submission,
)
from .store import DispatchStore, KeyReused

__all__ = ["DispatchAPI", "Reply", "STORE_ERRORS", "is_dispatch_path"]

log = logging.getLogger("oarbank_ui.dispatch")
RETRY_AFTER_S = 5
PURGE_EVERY_S = 60.0
POLL_S = 1.0  # a long poll looks at the store this often (other portals' submits)
MAX_PAGE = 1000
CLAIM_BATCH = 64  # claims in one transaction, at most
CLAIM_LINGER_S = 0.0  # a batch is what waited while the last one was written
CLAIM_BOUND_S = 600.0
STATES = ("queued", "running", "succeeded", "failed", "cancelled")
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="oarbank-portal"'}


def _store_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [sqlite3.Error]
    try:
        import psycopg
        import psycopg_pool

        errors += [psycopg.Error, psycopg_pool.PoolTimeout]
    except ImportError:  # pragma: no cover - psycopg is a dependency
        pass
    return tuple(errors)


STORE_ERRORS = _store_errors()


def is_dispatch_path(parts: list[str]) -> bool:
    return len(parts) >= 2 and parts[0] == "v1" and parts[1] in ("jobs", "batches", "agent")


class Reply:
    """An answer: status, JSON document, headers (web/ turns it into its Response)."""

    def __init__(self, status: int, doc: Any, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.doc = doc
        self.headers = dict(headers or {})


def refusal(status: int, code: str, detail: str, *, field: str | None = None,
            headers: dict[str, str] | None = None) -> Reply:
    doc: dict[str, Any] = {"error": code, "detail": detail}
    if field is not None:
        doc["field"] = field
    return Reply(status, doc, headers)


def unavailable() -> Reply:
    return refusal(503, "unavailable", "the portal's store does not answer; nothing was stored "
                   "or changed: send it again", headers={"Retry-After": str(RETRY_AFTER_S)})


class _Waker:
    """Wakes the long-polled claims of this process when jobs arrive (other portals' jobs are
    seen by the poll)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def notify(self) -> None:  # any thread
        loop, event = self._loop, self._event
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    async def wait(self, seconds: float) -> None:
        if self._event is None or self._event.is_set():
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
        try:
            await asyncio.wait_for(self._event.wait(), seconds)
        except asyncio.TimeoutError:
            pass


class DispatchAPI:
    def __init__(self, store: DispatchStore, catalogue: Catalogue,
                 node_for_token: Callable[[str], str | None], metrics: Any, *,
                 clock: Callable[[], float] = time.time, lease_s: float = 60.0,
                 retention_s: float = 168 * 3600.0, mode: str = "warm-aware",
                 starve_s: float = 60.0, poll_s: float = POLL_S) -> None:
        if mode not in placement.MODES:
            raise ValueError(f"placement must be one of {', '.join(placement.MODES)}")
        self.store = store
        self.claims = Claims(store)
        self.catalogue = catalogue
        self.node_for_token = node_for_token
        self.metrics = metrics
        self.clock = clock
        self.lease_s = lease_s
        self.retention_s = retention_s
        self.mode = mode
        self.starve_s = starve_s
        self.poll_s = poll_s
        self.waker = _Waker()
        self._purged_at = 0.0
        # claims that come together share a transaction (its thread starts on first use, in
        # the serving process); a claim is never refused for waiting (bound_s: a long poll's)
        self._claim_writer: GroupCommit[ClaimWork, Claimed | Exception] = GroupCommit(
            lambda works: list(self._write_claims(works)), key=lambda w: w.claim.node_id,
            failed=lambda e: e,
            late=lambda s: TimeoutError(f"claim waited over {s:g} s for the store"),
            bound_s=CLAIM_BOUND_S, max_batch=CLAIM_BATCH, linger_s=CLAIM_LINGER_S,
            on_batch=lambda n, _s: metrics.claims_done(n))

    def close(self) -> None:
        """The claims' writer finishes what it holds and stops."""
        self._claim_writer.close()

    # -- credentials ---------------------------------------------------------------------------

    def _submitter(self, headers: Mapping[str, str]) -> str | Reply:
        token = bearer_token(headers.get("authorization"))
        name = self.store.submitter_for_token(token) if token else None
        if name is None:
            return refusal(401, "unauthenticated", "no submitter credential (Authorization: "
                           "Bearer <token> from `oarbank-portal token issue --submitter NAME`)",
                           headers=_CHALLENGE)
        return name

    def _node(self, headers: Mapping[str, str], claimed: str) -> str | Reply:
        token = bearer_token(headers.get("authorization"))
        node = self.node_for_token(token) if token else None
        return node if node == claimed else self._wrong_token(node, claimed)

    @staticmethod
    def _unauthenticated() -> Reply:
        return refusal(401, "unauthenticated", "no node credential (Authorization: Bearer "
                       "<token> from `oarbank-portal token issue NODE_ID`)", headers=_CHALLENGE)

    def _wrong_token(self, node: str | None, claimed: str) -> Reply:
        """The refusal of a token that is no node's, or another node's than the body's."""
        if node is None:
            return self._unauthenticated()
        log.warning("dispatch: node %s sent a body naming node %r: refused", node, claimed)
        return refusal(403, "wrong_node", f"this token is node {node}'s, not {claimed}'s")

    @staticmethod
    def _json(body: bytes, headers: Mapping[str, str]) -> Any:
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            raise _Refused(refusal(415, "bad_request", "Content-Type must be application/json, "
                                   f"got {ctype or 'none'}"))
        try:
            return json.loads(body or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise _Refused(refusal(400, "bad_request", f"the body is not JSON: {e}",
                                   field="")) from None

    # -- requests ------------------------------------------------------------------------------

    def handle(self, method: str, parts: list[str], query: dict[str, list[str]], body: bytes,
               headers: Mapping[str, str]) -> Reply:
        """A dispatch request other than a claim (``headers``: lower-case names)."""
        try:
            return self._route(method, parts, query, body, headers)
        except _Refused as r:
            return r.reply
        except BadRequest as e:
            return refusal(400, "bad_request", str(e), field=e.field)
        except STORE_ERRORS as e:
            log.warning("dispatch: the store does not answer: %s: %s", type(e).__name__, e)
            return unavailable()

    def _route(self, method: str, parts: list[str], query: dict[str, list[str]], body: bytes,
               headers: Mapping[str, str]) -> Reply:
        rest = parts[1:]
        if rest[0] == "agent":
            if method != "POST" or len(rest) != 2 or rest[1] not in ("renew", "result",
                                                                      "release", "claim"):
                return refusal(404, "not_found", f"nothing at /{'/'.join(parts)} for "
                               f"{method}")
            doc = self._json(body, headers)
            if rest[1] == "claim":  # in-process callers (the server awaits claim())
                return self._claim_now(doc, headers)
            return {"renew": self._renew, "result": self._result,
                    "release": self._release}[rest[1]](doc, headers)
        who = self._submitter(headers)
        if isinstance(who, Reply):
            return who
        if rest == ["jobs"]:
            if method == "POST":
                return self._submit(who, self._json(body, headers))
            if method in ("GET", "HEAD"):
                return self._batch_page(who, query)
        elif rest[0] == "jobs" and len(rest) == 2 and method in ("GET", "HEAD"):
            job = self.store.job(who, rest[1])
            return Reply(200, job) if job else self._no_job(rest[1])
        elif rest[0] == "jobs" and len(rest) == 3 and rest[2] == "cancel" and method == "POST":
            got = self.store.cancel(who, rest[1], now=self.clock(), retention_s=self.retention_s)
            if got is None:
                return self._no_job(rest[1])
            outcome, job = got
            if outcome == "job_done":
                return Reply(409, {"error": "job_done", "detail": f"job {rest[1]} already "
                                   f"ended ({job['state']})", "job": job})
            return Reply(200, job)
        elif rest[0] == "batches" and len(rest) == 2 and method in ("GET", "HEAD"):
            counts = self.store.batch_counts(who, rest[1])
            return Reply(200, counts) if counts else self._no_batch(rest[1])
        elif rest[0] == "batches" and len(rest) == 3 and rest[2] == "cancel" and method == "POST":
            n = self.store.cancel_batch(who, rest[1], now=self.clock(),
                                        retention_s=self.retention_s)
            return Reply(200, {"cancelled": n}) if n is not None else self._no_batch(rest[1])
        return refusal(404, "not_found", f"nothing at /{'/'.join(parts)} for {method}")

    @staticmethod
    def _no_job(job_id: str) -> Reply:
        return refusal(404, "not_found", f"no job {job_id!r} of this submitter")

    @staticmethod
    def _no_batch(batch_id: str) -> Reply:
        return refusal(404, "not_found", f"no batch {batch_id!r} of this submitter")

    def _submit(self, who: str, doc: Any) -> Reply:
        sub = read_submission(doc, self.catalogue)
        now = self.clock()
        try:
            done = self.store.submit(who, sub, now=now)
        except KeyReused:
            return refusal(409, "idempotency_key_reused", f"idempotency_key "
                           f"{sub.idempotency_key!r} was used for other jobs",
                           field="idempotency_key")
        if not done.replayed:
            self.metrics.submitted.inc(len(done.jobs))
            self.waker.notify()
        self._upkeep(now)
        return Reply(200 if done.replayed else 201, {"batch_id": done.batch_id,
                                                     "replayed": done.replayed,
                                                     "jobs": done.jobs})

    def _batch_page(self, who: str, query: dict[str, list[str]]) -> Reply:
        for k, v in query.items():
            if k not in ("batch", "state", "after", "limit"):
                raise BadRequest(k, "unknown parameter (batch, state, after, limit)")
            if len(v) != 1:
                raise BadRequest(k, f"given {len(v)} times")
        args = {k: v[0] for k, v in query.items()}
        if not args.get("batch"):
            raise BadRequest("batch", "required: the batch_id a submit answered")
        state = args.get("state")
        if state is not None and state not in STATES:
            raise BadRequest("state", f"must be one of {', '.join(STATES)}, got {state!r}")
        text = args.get("limit", str(MAX_PAGE))
        if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
            raise BadRequest("limit", f"must be a whole number 1..{MAX_PAGE}, got {text!r}")
        got = self.store.batch_jobs(who, args["batch"], state=state, after=args.get("after"),
                                    limit=int(text))
        if got is None:
            return self._no_batch(args["batch"])
        page, nxt = got
        reply = Reply(200, page)
        if nxt is not None:
            link = "/v1/jobs?" + urlencode({k: v for k, v in (("batch", args["batch"]),
                                            ("state", state), ("after", nxt),
                                            ("limit", text)) if v is not None})
            reply.headers["Link"] = f'<{link}>; rel="next"'
        return reply

    # -- the agent's side ----------------------------------------------------------------------

    async def claim(self, body: bytes, headers: Mapping[str, str], run: Callable[..., Any],
                    gone: Callable[[], bool] = lambda: False) -> Reply:
        """A long-polled claim, on the event loop: its store work goes to the claims' group
        commit (``_claim_writer``), a long poll's look for new work to ``run(fn, *args)`` (the
        thread pool). ``gone()``: its node went away (stopped, timed out), so the poll ends
        granting nothing: a grant nobody reads would wait out its lease."""
        try:
            claim, work = self._first_work(self._json(body, headers), headers)
            reply = self._answer(claim, await self._committed(work))
            # (a claim carrying results is answered at once: the node learns their fate now)
            if reply.status != 200 or reply.doc["grants"] or claim.results:
                return reply
            again = self._work(claim, first=False)
            deadline = time.monotonic() + claim.wait_s
            while (left := deadline - time.monotonic()) > 0 and not gone():
                await self.waker.wait(min(self.poll_s, left))
                if not await run(self.store.has_work, work.pairs, self.clock()) or gone():
                    continue
                reply = self._answer(claim, await self._committed(again))
                if reply.status != 200 or reply.doc["grants"]:
                    return reply
            return reply
        except _Refused as r:
            return r.reply
        except BadRequest as e:
            return refusal(400, "bad_request", str(e), field=e.field)
        except STORE_ERRORS as e:
            log.warning("dispatch: the store does not answer: %s: %s", type(e).__name__, e)
            return unavailable()
        except TimeoutError as e:  # waited past the group commit's bound
            log.warning("dispatch: %s", e)
            return unavailable()

    async def _committed(self, work: ClaimWork) -> Claimed:
        """``work`` done by the group commit, with the claims that came with it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Claimed | Exception] = loop.create_future()
        self._claim_writer.submit(work, fut, loop)
        done = await fut
        if isinstance(done, Exception):
            raise done
        return done

    def _write_claims(self, works: list[ClaimWork]) -> list[Claimed]:
        """Claims in one transaction (the group commit's batch, in its thread; or an
        in-process caller's one), then the hourly upkeep."""
        now = self.clock()
        done = self.claims.batch(works, now=now, lease_s=self.lease_s,
                                 retention_s=self.retention_s)
        self._upkeep(now)
        return done

    def _claim_now(self, doc: Any, headers: Mapping[str, str]) -> Reply:
        """A claim from an in-process caller (``handle``): its own transaction, no long poll."""
        claim, work = self._first_work(doc, headers)
        return self._answer(claim, self._write_claims([work])[0])

    def _first_work(self, doc: Any, headers: Mapping[str, str]) -> tuple[Claim, ClaimWork]:
        """The request's claim and its first look, its token to be checked in the
        transaction (none at all: refused here)."""
        claim = read_claim(doc)
        token = bearer_token(headers.get("authorization"))
        if not token:
            raise _Refused(self._unauthenticated())
        return claim, self._work(claim, first=True, token=token)

    def _work(self, claim: Claim, *, first: bool, token: str | None = None) -> ClaimWork:
        def choose(queue: dict[tuple[str, str], tuple[int, float]],
                   warm: dict[tuple[str, str], offers.Warmth],
                   cold: dict[tuple[str, str], int]) -> list[placement.Pick]:
            cands = offers.candidates(claim, self.catalogue, queue, warm, cold)
            node = placement.Node(claim.max_grants, claim.free_mem_gb, claim.evictable_mem_gb)
            return placement.decide(node, cands, mode=self.mode, starve_s=self.starve_s)

        return ClaimWork(claim, offers.offered_stages(claim, self.catalogue), choose, first,
                         token_hash(token) if token else None,
                         [r for r in claim.results if isinstance(r, Result)] if first else [])

    def _answer(self, claim: Claim, done: Claimed) -> Reply:
        """The claim's answer from what its transaction did (its token refused: nothing of
        its own; the leases the transaction expired are counted all the same)."""
        self._count(done.expired)
        if done.node != claim.node_id:
            return self._wrong_token(done.node, claim.node_id)
        for g in done.grants:
            self.metrics.grants.labels(g["placement"]).inc()
            if g["placement"] == "cold":
                self.metrics.cold_starts.inc()
        answer: dict[str, Any] = {"now": done.now, "lease_s": self.lease_s,
                                  "renew_s": self.lease_s / 3, "grants": done.grants}
        if claim.results:  # each in the order sent, as 10.7 would answer it alone
            finished = iter(done.finished)
            answer["results"] = [self._carried(claim.node_id, r, finished)
                                 for r in claim.results]
        return Reply(200, answer)

    def _carried(self, node: str, res: Result | BadRequest,
                 finished: Iterator[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
        """The answer to one result a claim carried: its status and body as 10.7's."""
        if isinstance(res, BadRequest):
            return {"status": 400, "error": "bad_request", "detail": str(res),
                    "field": res.field}
        status, answer = next(finished)
        self._counted(node, res, status, answer)
        return {"attempt_id": res.attempt_id, "status": status, **answer}

    def _counted(self, node: str, res: Result, status: int, answer: dict[str, Any]) -> None:
        """A result's metrics and, when refused, its log line."""
        if status == 200 and not answer.get("replayed"):
            self.metrics.results.labels(res.state).inc()
        elif status != 200:
            self.metrics.results_refused.labels(answer["error"]).inc()
            log.warning("dispatch: result of node %s for attempt %s refused: %s", node,
                        res.attempt_id, answer["detail"])

    def _renew(self, doc: Any, headers: Mapping[str, str]) -> Reply:
        node_id, refs = attempt_refs(doc)
        node = self._node(headers, node_id)
        if isinstance(node, Reply):
            return node
        now = self.clock()
        renewed, lost, expired = self.store.renew(node, refs, now=now, lease_s=self.lease_s)
        self._count(expired)
        for x in lost:
            if x["error"] == "not_your_attempt":
                log.warning("dispatch: node %s renewed attempt %s, not its own: refused", node,
                            x["attempt_id"])
        return Reply(200, {"now": now, "renewed": renewed, "lost": lost})

    def _result(self, doc: Any, headers: Mapping[str, str]) -> Reply:
        res = read_result(doc)
        node = self._node(headers, res.node_id)
        if isinstance(node, Reply):
            return node
        status, answer, expired = self.store.finish(res, now=self.clock(),
                                                    retention_s=self.retention_s)
        self._count(expired)
        self._counted(node, res, status, answer)
        return Reply(status, answer)

    def _release(self, doc: Any, headers: Mapping[str, str]) -> Reply:
        rel = read_release(doc)
        node = self._node(headers, rel.node_id)
        if isinstance(node, Reply):
            return node
        status, answer = self.store.release(node, rel.attempt_id, rel.generation,
                                            now=self.clock())
        if status == 200 and not answer.get("replayed"):
            self.waker.notify()
        return Reply(status, answer)

    def _count(self, expired: int) -> None:
        if expired:
            self.metrics.lease_expiries.inc(expired)
            self.waker.notify()

    def _upkeep(self, now: float) -> None:
        """Forget expired results, at most once a minute per process."""
        if now - self._purged_at < PURGE_EVERY_S:
            return
        self._purged_at = now
        try:
            self.store.purge(now=now)
        except STORE_ERRORS:
            log.exception("dispatch: purging expired results failed (tried again later)")


class _Refused(Exception):
    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.doc.get("detail"))
        self.reply = reply
