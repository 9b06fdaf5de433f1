"""``POST /v1/heartbeat`` past its headers (``asgi.py`` checked them and read the body): the
token, the report, its answer. It gets what it needs of the portal (its store, figures,
refusals, token check, clock) as arguments, so it never imports the app that makes it.

- The token: node ids by token hash, cached in the process (a lookup per report was a third of
  the store's work), every issued token read at the first report. The cache is only a hint:
  every write checks the token again inside its transaction (store/write.py), and a report
  whose token was revoked or replaced meanwhile is answered 401 and its entry dropped. A token
  not in the cache is looked up in the thread pool.
- The report: parsed on the event loop (a thread hop costs about as much as the parsing),
  a full heartbeat or a still-alive (ingest/validate.py), its node's own.
- Backpressure: when the group commit's queue is older than its admission limit
  (``GroupCommit.overloaded``) the report is answered 503 with ``Retry-After`` before it is
  parsed, and one that waited too long in the queue the same way; a report's answer never
  waits past ``bound_s``.
- The answer to a stored full report carries ``alive``: the digest a still-alive may name
  next (an agent that does not know the key ignores it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from starlette.concurrency import run_in_threadpool

from ..ingest.report import Outcome, Report, report_digest
from ..ingest.validate import Heartbeat, HeartbeatError, StillAlive, parse_report, parse_unchanged
from ..store.group_commit import DEFAULT_LINGER_S, GroupCommit
from ..store.heartbeats import HeartbeatStore
from ..store.tokens import bearer_token, token_hash
from .prometheus import PortalMetrics
from .responses import Admission, Response, json_response

__all__ = ["HeartbeatIngest"]

log = logging.getLogger("oarbank_ui.ingest")

_MAX_CACHED = 200_000  # tokens; past it the cache starts over (a fleet's worth and more)
_EXPIRED = Outcome("expired")  # a report's bound passed before its commit


def _expire(fut: asyncio.Future[Outcome]) -> None:
    if not fut.done():
        fut.set_result(_EXPIRED)


_UNCOUNTED = ("revoked", "send_full", "overloaded", "store_error", "expired")  # refusals


def _counters(m: Any, report: Report, outcome: Outcome) -> tuple[Any, ...]:
    """The counters a report's answer adds one to (refusals count as ``refused``)."""
    if outcome.status in _UNCOUNTED:
        return ()
    if not outcome.applied:
        return (m.not_applied,)
    return (m.accepted, m.still_alive) if report.short else (m.accepted,)


# Refusals the app makes too, worded once.
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="oarbank-portal"'}
TOKEN_UNKNOWN = "heartbeat: the token is not one this portal issued, or it was revoked"
STORE_FAILED = ("heartbeat: the portal could not store it (see the portal's log); send it "
                "again")

Refuse = Callable[..., Response]  # (cause, status, message, headers=None): counted, logged


class HeartbeatIngest:
    def __init__(self, store: HeartbeatStore, metrics: PortalMetrics, refuse: Refuse,
                 check_token: Callable[[str], Admission | Response],
                 clock: Callable[[], float], *, bound_s: float = 1.0, retry_after_s: int = 10,
                 max_batch: int = 1000, linger_s: float = DEFAULT_LINGER_S) -> None:
        self.store, self.metrics, self.refuse = store, metrics, refuse
        self.check_token, self.clock = check_token, clock
        self.bound_s = bound_s
        self.retry_after_s = retry_after_s
        m = metrics
        self.writer: GroupCommit[Report, Outcome] = GroupCommit(
            store.record_batch, key=lambda r: r.node_id,
            failed=lambda e: Outcome("store_error", f"{type(e).__name__}: {e}"),
            late=lambda s: Outcome("overloaded", f"waited over {s:g} s for the store"),
            bound_s=bound_s, max_batch=max_batch, linger_s=linger_s,
            on_batch=lambda n, s: m.batch_done(n, s, self.writer.age()),
            on_settled=self._count)
        self._nodes: dict[str, str] = {}  # token hash -> node id
        # node id -> the digest of its report this process last stored: a whole report with
        # that digest again is not validated again (parse_unchanged), only its head
        self._stored: dict[str, str] = {}
        self._preloaded = False

    # -- the event loop's path (asgi.py) ---------------------------------------------------

    async def post(self, headers: Mapping[str, str], body: bytes) -> Response:
        if self.writer.overloaded():
            return self._overloaded("the portal's store is behind")
        token = bearer_token(headers.get("authorization"))
        assert token is not None  # admit(lookup=False) refused a report without one
        if not self._preloaded:
            self._preloaded = True  # once; reports meanwhile look their token up alone
            await run_in_threadpool(self._preload)
        h = token_hash(token)
        node = self._nodes.get(h)
        if node is None:
            found = await run_in_threadpool(self._lookup, token)
            if not isinstance(found, str):
                return found
            node = found
        report = self.prepare(body, node, h)
        if not isinstance(report, Report):
            return report
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Outcome] = loop.create_future()
        try:
            self.writer.submit(report, fut, loop)
        except RuntimeError:
            return self._overloaded("the portal is stopping")
        # the bound as a timer that settles the future (no task or shield per report)
        timer = loop.call_later(self.bound_s, _expire, fut)
        try:
            outcome = await fut
        finally:
            timer.cancel()
        if outcome is _EXPIRED:
            # still queued or being written: it may yet be stored; the node's next report
            # says the same again, so answering "send it again" loses nothing
            return self._overloaded(f"not stored within {self.bound_s:g} s")
        return self.answer(report, outcome, counted=True)

    def _count(self, settled: list[tuple[Report, Outcome]]) -> None:
        """A batch's answers to come, counted as ``answer`` counts them, one write a figure
        (each is a lock and an mmap write with ``--workers``). Runs on the event loop before
        the batch's futures are settled, so a scrape after an answer sees its report."""
        m = self.metrics
        counts = {m.accepted: 0, m.not_applied: 0, m.still_alive: 0}
        for report, outcome in settled:
            for counter in _counters(m, report, outcome):
                counts[counter] += 1
        for counter, n in counts.items():
            if n:
                counter.inc(n)

    def _preload(self) -> None:
        """Every issued token's node, read at once: without it each process of
        ``--workers N`` looks up each node's token on its first report, a fleet's worth of
        lookups in the first period."""
        try:
            with self.store.session():
                known = self.store.token_nodes(limit=_MAX_CACHED)
        except Exception:  # the cache is a hint: reports look their tokens up one by one
            log.exception("reading the issued tokens failed; looking each up on its report")
            return
        self._nodes.update(known)

    def _lookup(self, token: str) -> str | Response:
        with self.store.session():
            got = self.check_token(token)
        if not isinstance(got, Admission):
            return got
        if len(self._nodes) >= _MAX_CACHED:
            self._nodes.clear()
        self._nodes[token_hash(token)] = got.node_id
        return str(got.node_id)

    # -- shared with the in-process path (Portal.heartbeat) --------------------------------

    def prepare(self, body: bytes, node_id: str, token_h: str | None) -> Report | Response:
        """The checked report of ``node_id``, or the refusal to answer."""
        received_at = self.clock()  # the order of reports is the order they arrived here
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return self.refuse("malformed", 400, f"heartbeat: not JSON ({e})")
        # a whole report's digest first: the same as the one this process last stored for the
        # node, it is that report again (validated then) but its time
        digest = (report_digest(doc) if isinstance(doc, dict)
                  and not ("alive" in doc and "services" not in doc) else "")
        unchanged = bool(digest) and self._stored.get(node_id) == digest
        try:
            what = parse_unchanged(doc, digest) if unchanged else parse_report(doc)
        except HeartbeatError as e:
            return self.refuse("malformed", 400, f"heartbeat: {e}")
        if what.node_id != node_id:
            return self.refuse("wrong_node", 403, f"heartbeat: the token is node {node_id!r}'s;"
                                 f" this report is for {what.node_id!r}")
        if unchanged:
            return Report(what, digest, received_at, token_h, whole=doc)
        return Report(what, what.digest if isinstance(what, StillAlive) else digest,
                      received_at, token_h)

    def record_now(self, report: Report) -> Outcome:
        """Store one report in its own transaction (the in-process path; no queue)."""
        return self.store.record_batch([report])[0]

    def answer(self, report: Report, outcome: Outcome, *, counted: bool = False) -> Response:
        """The answer to ``report``; ``counted``: its batch counted it (``_count``)."""
        if outcome.status == "revoked":
            if report.token_hash is not None:
                self._nodes.pop(report.token_hash, None)
            return self.refuse("unauthenticated", 401, TOKEN_UNKNOWN, CHALLENGE)
        if outcome.status == "send_full":
            return self.refuse("alive_unknown", 409, f"heartbeat: {outcome.reason}",
                                 {"X-Oarbank-Send": "full"})
        if outcome.status == "overloaded":
            return self._overloaded(outcome.reason)
        if outcome.status == "store_error":
            return self.refuse("store_error", 503, STORE_FAILED)
        if not counted:
            for counter in _counters(self.metrics, report, outcome):
                counter.inc()
        self._remember(report.node_id, outcome.digest if outcome.applied else None)
        doc: dict[str, Any] = {"ok": True, "applied": outcome.applied,
                               "reason": outcome.reason or None, "node_id": report.node_id}
        if isinstance(report.what, Heartbeat):
            doc["services"] = len(report.what.services)
        elif report.whole is not None:
            doc["services"] = len(report.whole["services"])
        if outcome.digest is not None:
            doc["alive"] = outcome.digest
        return json_response(200, doc)

    def _remember(self, node_id: str, digest: str | None) -> None:
        """What this process last stored for ``node_id`` (None: it does not know)."""
        if digest is None:
            self._stored.pop(node_id, None)
            return
        if len(self._stored) >= _MAX_CACHED and node_id not in self._stored:
            self._stored.clear()
        self._stored[node_id] = digest

    def _overloaded(self, why: str) -> Response:
        self.metrics.queue_age.set(self.writer.age())  # no batch ends while it is stuck
        return self.refuse("overloaded", 503, f"heartbeat: {why}; send the whole report "
                                  f"again after {self.retry_after_s} s",
                                  {"Retry-After": str(self.retry_after_s)})

    def close(self) -> None:
        self.writer.close()

