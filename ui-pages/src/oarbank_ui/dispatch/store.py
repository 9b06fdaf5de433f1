"""The dispatcher's state, all of it in the portal's store (SQLite or PostgreSQL, the tables of
migration 0005): submitters, batches, jobs, attempts with their leases, each node's latest
claim. Nothing the dispatcher decides lives only in a process: a portal killed and started
again, or a second portal on the same PostgreSQL, carries on from the tables.

Each call is one transaction. PostgreSQL: a claim takes its jobs with ``FOR UPDATE SKIP
LOCKED`` (portals claiming at once take different jobs, without waiting on each other); rows
are locked attempt first, then job, everywhere, so two transactions never wait on each other
in a circle. SQLite: one writer at a time (``BEGIN IMMEDIATE``).

Job states: queued -> running (granted) -> succeeded | failed; queued | running -> cancelled;
running -> queued when its lease expires or the node releases it (no charge: the next grant
is the next generation). Attempt states: running -> succeeded | failed | expired | released |
cancelled.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..store.tokens import new_token, token_hash
from .backlog import BACKLOG_CAP, BacklogCounts
from .jobview import job_view
from .leases import Attempt, fence, refusal_detail
from .offers import Warmth, needs_fleet
from .placement import Pick
from .protocol import Claim, Result, Submission
from .warmcache import Offer, WarmCache

__all__ = ["ClaimWork", "Claimed", "DispatchStore", "KeyReused", "new_id"]

FINISHED = ("succeeded", "failed", "cancelled")
OFFER_FRESH_S = 90.0  # a node's claim (or renew) this recent tells where a service is warm
OFFER_REWRITE_S = 5.0  # an offer the same as the one this process wrote this recently: kept
# a cold grant still live counts as a copy starting until its node's claim shows the service;
# one older than this is no start any more (and bounds the rows the query reads)
COLD_HORIZON_S = 3600.0
EXPIRE_BATCH = 500
ANALYZE_JOBS = 1_000  # PostgreSQL: jobs submitted before the planner's statistics are refreshed


def _accepted(job_id: str, state: str) -> dict[str, Any]:
    """The answer to a result accepted (and to its replays): everything in it is stored."""
    return {"accepted": True, "job_id": job_id, "state": state}


def new_id(prefix: str) -> str:
    """Sortable by creation (milliseconds), unique across portals (random tail)."""
    return f"{prefix}{int(time.time() * 1000):011x}{secrets.token_hex(4)}"


class KeyReused(Exception):
    """An idempotency key already used by this submitter for other jobs."""


@dataclass(frozen=True)
class Submitted:
    batch_id: str
    jobs: list[dict[str, Any]]  # job_id, state
    replayed: bool


Choose = Callable[[dict[tuple[str, str], tuple[int, float]], dict[tuple[str, str], Warmth],
                   dict[tuple[str, str], int]], list[Pick]]


@dataclass(frozen=True)
class ClaimWork:
    """One claim as the store takes it. ``choose(queue, warm, cold)`` is the placement
    decision (``placement.decide`` behind ``offers.candidates``). ``first``: the request's
    first look (not a long poll's later one): its offer is recorded, its ``results``
    finished, and ``token_hash`` (when given) checked against the claim's node first."""

    claim: Claim
    pairs: list[tuple[str, str]]
    choose: Choose
    first: bool
    token_hash: str | None = None
    results: Sequence[Result] = ()


@dataclass(frozen=True)
class Claimed:
    grants: list[dict[str, Any]]
    expired: int  # leases this transaction expired (counted in its first claim only)
    finished: list[tuple[int, dict[str, Any]]]  # (status, answer) of each result carried
    now: float  # the transaction's time: the grants' issued_at
    node: str | None  # the node the token names (another than the claim's: nothing was done)


class DispatchStore:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.pg = backend.kind == "postgresql"
        self._lock = " FOR UPDATE" if self.pg else ""
        self._skip = " FOR UPDATE SKIP LOCKED" if self.pg else ""
        # A stage's queue is read in this order: on PostgreSQL only the index of queued rows
        # gives it (migration 0007), never the primary key's walk over the done jobs before them.
        head = "seq + 0" if self.pg else "seq"
        self._queued = (" FROM jobs WHERE state = 'queued' AND module = ? AND stage = ?"
                        f" ORDER BY {head}")  # a stage's queued jobs, oldest first
        self._backlog = BacklogCounts()  # each stage's, shared by this process's claims
        self._warmth = WarmCache()  # the nodes' offers, read once per WARM_TTL_S (warmcache.py)
        # node -> (its offer as this process last wrote it, when): a claim saying the same
        # again soon after is not written again (_record_offer)
        self._offered: dict[str, tuple[tuple[Any, ...], float]] = {}
        self._unanalyzed = 0  # jobs this process submitted since its last ANALYZE (PostgreSQL)
        self._analyze_lock = threading.Lock()

    # -- submitters --------------------------------------------------------------------------

    def issue_submitter(self, name: str, *, now: float | None = None) -> tuple[str, bool]:
        """A new token for submitter ``name`` (replacing its previous one): (token, replaced)."""
        token = new_token()
        with self.backend.write() as tx:
            replaced = tx.run("DELETE FROM submitters WHERE name = ?", (name,)) > 0
            tx.run("INSERT INTO submitters (name, token_hash, issued_at) VALUES (?, ?, ?)",
                   (name, token_hash(token), time.time() if now is None else now))
        return token, replaced

    def revoke_submitter(self, name: str) -> bool:
        with self.backend.write() as tx:
            return tx.run("DELETE FROM submitters WHERE name = ?", (name,)) > 0

    def submitters(self) -> list[dict[str, Any]]:
        with self.backend.read() as tx:
            return tx.all("SELECT name, issued_at FROM submitters ORDER BY name")

    def submitter_for_token(self, token: str) -> str | None:
        with self.backend.read(snapshot=False) as tx:
            row = tx.one("SELECT name FROM submitters WHERE token_hash = ?", (token_hash(token),))
        return None if row is None else str(row["name"])

    # -- submitting and reading ----------------------------------------------------------------

    def submit(self, submitter: str, sub: Submission, *, now: float) -> Submitted:
        """Store the jobs (all or none) as one batch; a key seen before answers its batch."""
        with self.backend.write() as tx:
            if sub.idempotency_key is not None:
                old = tx.one("SELECT batch_id, digest FROM job_batches WHERE submitter = ? AND"
                             " idempotency_key = ?", (submitter, sub.idempotency_key))
                if old is not None:
                    if old["digest"] != sub.digest:
                        raise KeyReused(sub.idempotency_key)
                    rows = tx.all("SELECT job_id, state FROM jobs WHERE batch_id = ? ORDER BY"
                                  " seq", (old["batch_id"],))
                    return Submitted(str(old["batch_id"]), rows, True)
            batch = new_id("B")
            tx.run("INSERT INTO job_batches (batch_id, submitter, idempotency_key, digest, jobs,"
                   " submitted_at) VALUES (?, ?, ?, ?, ?, ?)",
                   (batch, submitter, sub.idempotency_key, sub.digest, len(sub.jobs), now))
            ids = [new_id("J") for _ in sub.jobs]
            tx.many("INSERT INTO jobs (job_id, batch_id, submitter, module, stage, payload,"
                    " state, submitted_at) VALUES (?, ?, ?, ?, ?, ?, 'queued', ?)",
                    [(i, batch, submitter, j.module, j.stage, j.payload, now)
                     for i, j in zip(ids, sub.jobs, strict=True)])
        self._backlog.forget()
        if self.pg:
            self._analyze_after(len(ids))
        return Submitted(batch, [{"job_id": i, "state": "queued"} for i in ids], False)

    def _analyze_after(self, submitted: int) -> None:
        """PostgreSQL plans the queue's reads from its statistics, which a large submit makes
        stale until autovacuum comes (up to a minute): the head of 60,000 queued jobs was then
        found by sorting them all (10-20 ms a claim). So ANALYZE after ANALYZE_JOBS."""
        with self._analyze_lock:
            self._unanalyzed += submitted
            due = self._unanalyzed >= ANALYZE_JOBS
            if due:
                self._unanalyzed = 0
        if due:
            with self.backend.write() as tx:
                tx.run("ANALYZE jobs")

    def job(self, submitter: str, job_id: str) -> dict[str, Any] | None:
        with self.backend.read(snapshot=False) as tx:
            r = tx.one("SELECT * FROM jobs WHERE job_id = ? AND submitter = ?",
                       (job_id, submitter))
        return None if r is None else job_view(r)

    def batch_jobs(self, submitter: str, batch_id: str, *, state: str | None = None,
                   after: str | None = None, limit: int = 1000
                   ) -> tuple[list[dict[str, Any]], str | None] | None:
        """A page of the batch's records in submission order, and the next page's ``after``
        (None: last page); None when the submitter has no such batch."""
        with self.backend.read() as tx:
            if tx.one("SELECT 1 AS x FROM job_batches WHERE batch_id = ? AND submitter = ?",
                      (batch_id, submitter)) is None:
                return None
            where, args = "batch_id = ?", [batch_id]
            if state is not None:
                where += " AND state = ?"
                args.append(state)
            if after is not None:
                where += " AND seq > (SELECT seq FROM jobs WHERE job_id = ?)"
                args.append(after)
            rows = tx.all(f"SELECT * FROM jobs WHERE {where} ORDER BY seq LIMIT ?",
                          [*args, limit + 1])
        page = [job_view(r) for r in rows[:limit]]
        return page, (page[-1]["job_id"] if len(rows) > limit else None)

    def batch_counts(self, submitter: str, batch_id: str) -> dict[str, Any] | None:
        with self.backend.read() as tx:
            b = tx.one("SELECT jobs FROM job_batches WHERE batch_id = ? AND submitter = ?",
                       (batch_id, submitter))
            if b is None:
                return None
            rows = tx.all("SELECT state, node_id, COUNT(*) AS n FROM jobs WHERE batch_id = ?"
                          " GROUP BY state, node_id", (batch_id,))
        states = dict.fromkeys(("queued", "running", "succeeded", "failed", "cancelled"), 0)
        nodes: dict[str, dict[str, int]] = {}
        for r in rows:
            states[r["state"]] = states.get(r["state"], 0) + int(r["n"])
            if r["node_id"] is not None and r["state"] in ("running", "succeeded", "failed"):
                per = nodes.setdefault(r["node_id"], {"running": 0, "succeeded": 0, "failed": 0})
                per[r["state"]] += int(r["n"])
        return {"batch_id": batch_id, "jobs": int(b["jobs"]), "states": states, "nodes": nodes}

    def cancel(self, submitter: str, job_id: str, *, now: float,
               retention_s: float) -> tuple[str, dict[str, Any]] | None:
        """("cancelled" | "job_done", the record), or None: no such job of the submitter."""
        with self.backend.write() as tx:
            j = tx.one("SELECT attempt_id FROM jobs WHERE job_id = ? AND submitter = ?",
                       (job_id, submitter))
            if j is None:
                return None
            if j["attempt_id"] is not None:  # attempt first, then job (the module's lock order)
                tx.one(f"SELECT attempt_id FROM attempts WHERE attempt_id = ?{self._lock}",
                       (j["attempt_id"],))
            r = tx.one(f"SELECT * FROM jobs WHERE job_id = ?{self._lock}", (job_id,))
            assert r is not None
            if r["state"] in FINISHED:
                return "job_done", job_view(r)
            self._cancel_rows(tx, [r], now, retention_s)
            r = tx.one("SELECT * FROM jobs WHERE job_id = ?", (job_id,))
        assert r is not None
        return "cancelled", job_view(r)

    def cancel_batch(self, submitter: str, batch_id: str, *, now: float,
                     retention_s: float) -> int | None:
        with self.backend.write() as tx:
            if tx.one("SELECT 1 AS x FROM job_batches WHERE batch_id = ? AND submitter = ?",
                      (batch_id, submitter)) is None:
                return None
            live = tx.all("SELECT job_id, attempt_id, state FROM jobs WHERE batch_id = ? AND"
                          " state IN ('queued', 'running')", (batch_id,))
            ids = [r["attempt_id"] for r in live if r["state"] == "running"]
            if ids and self.pg:
                tx.all("SELECT attempt_id FROM attempts WHERE attempt_id = ANY(?) FOR UPDATE",
                       (ids,))
            rows = tx.all(f"SELECT job_id, attempt_id, state FROM jobs WHERE batch_id = ? AND"
                          f" state IN ('queued', 'running'){self._lock}", (batch_id,))
            return self._cancel_rows(tx, rows, now, retention_s)

    def _cancel_rows(self, tx: Any, rows: list[dict[str, Any]], now: float,
                     retention_s: float) -> int:
        self._backlog.forget()
        n = 0
        for r in rows:
            if r["state"] not in ("queued", "running"):
                continue
            if r["state"] == "running" and r["attempt_id"] is not None:
                tx.run("UPDATE attempts SET state = 'cancelled', ended_at = ? WHERE attempt_id"
                       " = ? AND state = 'running'", (now, r["attempt_id"]))
            n += tx.run("UPDATE jobs SET state = 'cancelled', finished_at = ?, expires_at = ?"
                        " WHERE job_id = ? AND state IN ('queued', 'running')",
                        (now, now + retention_s, r["job_id"]))
        return n

    # -- the agent's side ------------------------------------------------------------------------

    def has_work(self, pairs: list[tuple[str, str]], now: float) -> bool:
        """Whether a claim could change anything: a job queued for one of ``pairs``, or a
        lease to expire (a cheap read: a long poll asks it each round)."""
        with self.backend.read(snapshot=False) as tx:
            if tx.one("SELECT 1 AS x FROM attempts WHERE state = 'running' AND expires_at < ?"
                      " LIMIT 1", (now,)) is not None:
                return True
            return any(tx.one(f"SELECT 1 AS x{self._queued} LIMIT 1", p) is not None
                       for p in pairs)

    def claim_batch(self, works: Sequence[ClaimWork], *, now: float, lease_s: float,
                    retention_s: float) -> list[Claimed]:
        """Each claim's grants, in one transaction (the group commit's batch: one commit,
        one expiry of leases, for the claims that came together). Leases expired here are
        counted in the first claim's ``Claimed``. A failure rolls all of it back, and what
        this process keeps of the store (the backlog counts, the warmth read) is read again."""
        try:  # pipelined (PostgreSQL): a statement whose answer is not read is not waited for
            with self.backend.write(pipelined=True) as tx:
                expired = self._expire(tx, now)
                if expired:
                    self._backlog.forget()
                nodes = self._token_nodes(tx, [w.token_hash for w in works if w.token_hash])
                out = [self._claim(tx, w, nodes, now, lease_s, retention_s) for w in works]
        except BaseException:
            self._backlog.forget()
            self._warmth.forget()
            self._offered.clear()  # (what it wrote may be what was rolled back)
            raise
        if out and expired:
            out[0] = replace(out[0], expired=expired)
        return out

    @staticmethod
    def _token_nodes(tx: Any, hashes: list[str]) -> dict[str, str]:
        """The node each token hash names (one read for the batch's claims)."""
        if not hashes:
            return {}
        marks = ", ".join("?" * len(hashes))
        return {str(r["token_hash"]): str(r["node_id"]) for r in tx.all(
            f"SELECT token_hash, node_id FROM node_tokens WHERE token_hash IN ({marks})",
            hashes)}

    def _claim(self, tx: Any, w: ClaimWork, nodes: dict[str, str], now: float, lease_s: float,
               retention_s: float) -> Claimed:
        """One claim inside ``tx``: the token checked (a request's first claim: nothing
        else is done for a token not the claim's node's; ``nodes``: each token's node, read in
        this transaction), the results it carries finished (as ``finish`` would answer them),
        its offer recorded, then its grants."""
        claim = w.claim
        if w.token_hash is not None:
            node = nodes.get(w.token_hash)
            if node != claim.node_id:
                return Claimed([], 0, [], now, node)
        finished = [self._finish(tx, res, now, retention_s) for res in w.results]
        if w.first:
            self._record_offer(tx, claim, now)
        queue: dict[tuple[str, str], tuple[int, float]] = {}
        heads: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for module, stage in w.pairs:
            # the stage's head, as many jobs as the claim could take, locked now (PostgreSQL:
            # those another portal holds are skipped): its oldest's wait for placement, its
            # rows the grants (one read where there were two; what is not granted stays
            # queued, its lock gone at the commit)
            rows = tx.all(f"SELECT job_id, payload, generation, submitted_at{self._queued}"
                          " LIMIT ?" + self._skip, (module, stage, max(1, claim.max_grants)))
            if not rows:
                continue
            heads[(module, stage)] = rows
            queue[(module, stage)] = (self._count(tx, module, stage),
                                      max(0.0, now - float(rows[0]["submitted_at"])))
        if not queue:
            return Claimed([], 0, finished, now, claim.node_id)
        modules = sorted({m for m, _ in queue})
        if needs_fleet(claim, modules):
            picks = w.choose(queue, self._warm(tx, claim.node_id, modules, now),
                             self._cold(tx, claim.node_id, modules, now - COLD_HORIZON_S))
        else:  # (placement would read neither: two reads fewer for a warm node's claim)
            picks = w.choose(queue, {}, {})
        grants = []
        for p in picks:
            rows = heads[(p.module, p.stage)][:p.count]
            if not rows:
                continue
            # one INSERT for the claim's attempts of this stage, one UPDATE for their jobs
            values = ", ".join(["(?, ?, ?, ?, ?, ?, 'running', ?, ?)"] * len(rows))
            args: list[Any] = []
            for r in rows:
                args += [r["job_id"], int(r["generation"]) + 1, claim.node_id, p.module,
                         p.stage, p.placement, now, now + lease_s]
            made = tx.all("INSERT INTO attempts (job_id, generation, node_id, module, stage,"
                          f" placement, state, issued_at, expires_at) VALUES {values}"
                          " RETURNING attempt_id, job_id", args)
            ids = {a["job_id"]: int(a["attempt_id"]) for a in made}
            marks = ", ".join("?" * len(ids))
            tx.run("UPDATE jobs SET state = 'running', generation = a.generation, attempt_id"
                   " = a.attempt_id, node_id = a.node_id, placement = a.placement,"
                   " started_at = COALESCE(jobs.started_at, a.issued_at) FROM attempts a"
                   f" WHERE a.attempt_id IN ({marks}) AND jobs.job_id = a.job_id",
                   list(ids.values()))
            self._backlog.granted((p.module, p.stage), len(rows))
            for r in rows:
                grants.append({"attempt_id": ids[r["job_id"]], "job_id": r["job_id"],
                               "generation": int(r["generation"]) + 1, "module": p.module,
                               "stage": p.stage, "payload": json.loads(r["payload"]),
                               "placement": p.placement, "issued_at": now,
                               "expires_at": now + lease_s})
        return Claimed(grants, 0, finished, now, claim.node_id)

    def _count(self, tx: Any, module: str, stage: str) -> int:
        """Jobs queued for the stage, up to BACKLOG_CAP (backlog.py)."""
        def read() -> int:
            n = tx.one(f"SELECT COUNT(*) AS n FROM (SELECT 1 AS x{self._queued} LIMIT ?) q",
                       (module, stage, BACKLOG_CAP))
            return int(n["n"]) if n else 0

        return self._backlog.count((module, stage), read)

    def _record_offer(self, tx: Any, claim: Claim, now: float) -> None:
        """The node's offer, its rows replaced; not when this process wrote the same within
        ``OFFER_REWRITE_S`` (a node claims about once a job: most claims repeat the last;
        what reads the rows judges them by their content and by ``OFFER_FRESH_S``, far
        longer)."""
        latest = {(s.module, s.service): s for s in claim.services}
        tokens = {k: sum(total for _free, total in s.pools.values()) for k, s in latest.items()}
        said = tuple(sorted((k, s.state, tokens[k], s.load_s, s.job_s)
                            for k, s in latest.items()))
        last = self._offered.get(claim.node_id)
        if last is not None and last[0] == said and 0 <= now - last[1] < OFFER_REWRITE_S:
            return
        tx.run("DELETE FROM claim_offers WHERE node_id = ?", (claim.node_id,))
        tx.many("INSERT INTO claim_offers (node_id, module, service, state, tokens, load_s,"
                " job_s, claimed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(claim.node_id, s.module, s.service, s.state, tokens[k], s.load_s, s.job_s,
                  now) for k, s in latest.items()])
        self._offered[claim.node_id] = (said, now)
        self._warmth.record(claim.node_id, {k: Offer(s.state, tokens[k], s.job_s, s.load_s)
                                            for k, s in latest.items()})

    def _warm(self, tx: Any, node_id: str, modules: list[str],
              now: float) -> dict[tuple[str, str], Warmth]:
        """Each service on the other nodes whose claims are fresh (``warmcache.py``: this
        process's read of every node's offer, if it is recent)."""
        t = time.monotonic()
        if not self._warmth.covers(modules, t):
            wanted = sorted(set(modules) | self._warmth.modules)
            marks = ", ".join("?" * len(wanted))
            rows = tx.all("SELECT node_id, module, service, state, tokens, job_s, load_s FROM"
                          f" claim_offers WHERE module IN ({marks}) AND claimed_at >= ?",
                          [*wanted, now - OFFER_FRESH_S])
            self._warmth.fill(rows, wanted, t)
        return self._warmth.warmth(node_id, modules)

    def _cold(self, tx: Any, node_id: str, modules: list[str],
              since: float) -> dict[tuple[str, str], int]:
        """(module, stage) -> other nodes holding a live attempt granted it cold (since
        ``since``) whose claims do not say yet that the service is starting: copies starting
        that ``_warm`` cannot see (a node claims again only once it has room, after the load;
        claims answered at the same moment, on any portal, each count the others')."""
        marks = ", ".join("?" * len(modules))
        rows = tx.all("SELECT a.module, a.stage, COUNT(DISTINCT a.node_id) AS n FROM attempts a"
                      f" WHERE a.module IN ({marks}) AND a.placement = 'cold' AND a.issued_at >= ?"
                      " AND a.state = 'running' AND a.node_id <> ? AND NOT EXISTS (SELECT 1 FROM"
                      " claim_offers o WHERE o.node_id = a.node_id AND o.module = a.module AND"
                      " o.state IN ('ready', 'starting') AND o.claimed_at >= a.issued_at) GROUP BY"
                      " a.module, a.stage",
                      [*modules, since, node_id])
        return {(r["module"], r["stage"]): int(r["n"]) for r in rows}

    def _expire(self, tx: Any, now: float) -> int:
        """Leases past ``expires_at``: the attempt expired, its job queued again (no charge).
        Counted from what the statements return (a pipelined transaction has no row counts)."""
        rows = tx.all("SELECT attempt_id, job_id FROM attempts WHERE state = 'running' AND"
                      " expires_at < ? ORDER BY expires_at LIMIT ?" + self._skip,
                      (now, EXPIRE_BATCH))
        if not rows:
            return 0
        marks = ", ".join("?" * len(rows))
        ended = tx.all("UPDATE attempts SET state = 'expired', ended_at = ? WHERE attempt_id IN"
                       f" ({marks}) AND state = 'running' RETURNING attempt_id, job_id",
                       [now, *(r["attempt_id"] for r in rows)])
        if not ended:
            return 0
        # (a job's attempt_id is one of its own attempts: both lists name the same pairs)
        marks = ", ".join("?" * len(ended))
        queued = tx.all("UPDATE jobs SET state = 'queued', lease_expiries = lease_expiries + 1"
                        f" WHERE job_id IN ({marks}) AND attempt_id IN ({marks}) AND state ="
                        " 'running' RETURNING job_id",
                        [*(r["job_id"] for r in ended), *(r["attempt_id"] for r in ended)])
        return len(queued)

    def expire(self, *, now: float) -> int:
        with self.backend.write() as tx:
            n = self._expire(tx, now)
        if n:
            self._backlog.forget()
        return n

    def _attempt(self, tx: Any, attempt_id: int) -> tuple[dict[str, Any] | None,
                                                          Attempt | None]:
        a = tx.one(f"SELECT * FROM attempts WHERE attempt_id = ?{self._lock}", (attempt_id,))
        if a is None:
            return None, None
        j = tx.one(f"SELECT generation FROM jobs WHERE job_id = ?{self._lock}", (a["job_id"],))
        gen = int(j["generation"]) if j else int(a["generation"])
        return a, Attempt(str(a["node_id"]), int(a["generation"]), str(a["state"]),
                          float(a["expires_at"]), gen)

    def renew(self, node_id: str, refs: list[tuple[int, int]], *, now: float,
              lease_s: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        """(renewed, lost, expired by this transaction) for a node's live attempts."""
        renewed, lost = [], []
        with self.backend.write() as tx:
            expired = self._expire(tx, now)
            # a node running jobs keeps its claim's warmth fresh (it claims only when it has room)
            tx.run("UPDATE claim_offers SET claimed_at = ? WHERE node_id = ?", (now, node_id))
            for attempt_id, generation in refs:
                _row, a = self._attempt(tx, attempt_id)
                verdict = fence(a, node_id, generation, now)
                if verdict is None:
                    tx.run("UPDATE attempts SET expires_at = ? WHERE attempt_id = ?",
                           (now + lease_s, attempt_id))
                    renewed.append({"attempt_id": attempt_id, "expires_at": now + lease_s})
                elif verdict != "done":  # a finished attempt needs no lease; nothing to stop
                    lost.append({"attempt_id": attempt_id, "error": verdict})
        return renewed, lost, expired

    def finish(self, res: Result, *, now: float,
               retention_s: float) -> tuple[int, dict[str, Any], int]:
        """A node's result: (status, answer, leases expired by this transaction)."""
        with self.backend.write() as tx:
            expired = self._expire(tx, now)
            status, answer = self._finish(tx, res, now, retention_s)
        return status, answer, expired

    def _finish(self, tx: Any, res: Result, now: float,
                retention_s: float) -> tuple[int, dict[str, Any]]:
        """A result inside ``tx``, fenced (10.7): (status, answer). Leases are expired first
        by the caller, so a result after its lease ended is refused ``lease_lost``.

        The usual result, the node's live attempt, is one conditional UPDATE that holds what
        ``fence`` accepts (two statements fewer than reading both rows to judge them); any
        other reads the attempt and its job for ``fence`` to name the refusal, or the replay."""
        live = tx.one("UPDATE attempts SET state = ?, ended_at = ? WHERE attempt_id = ? AND"
                      " node_id = ? AND generation = ? AND state = 'running' AND expires_at >= ?"
                      " AND generation <= (SELECT j.generation FROM jobs j WHERE j.job_id ="
                      " attempts.job_id) RETURNING job_id",
                      (res.state, now, res.attempt_id, res.node_id, res.generation, now))
        if live is not None:
            tx.run("UPDATE jobs SET state = ?, finished_at = ?, expires_at = ?, record = ?,"
                   " result = ? WHERE job_id = ? AND attempt_id = ?",
                   (res.state, now, now + retention_s, res.record, res.result, live["job_id"],
                    res.attempt_id))
            return 200, _accepted(live["job_id"], res.state)
        row, a = self._attempt(tx, res.attempt_id)
        verdict = fence(a, res.node_id, res.generation, now)
        if verdict == "done":
            assert row is not None  # (answer: the form before the accepted answer was derived)
            answer = json.loads(row["answer"]) if row["answer"] else _accepted(row["job_id"],
                                                                               row["state"])
            return 200, answer | {"replayed": True}
        assert verdict is not None, "a live attempt is finished by the UPDATE above"
        return 409, {"error": verdict, "detail": refusal_detail(verdict, res.attempt_id)}

    def release(self, node_id: str, attempt_id: int, generation: int, *,
                now: float) -> tuple[int, dict[str, Any]]:
        with self.backend.write() as tx:
            row, a = self._attempt(tx, attempt_id)
            if a is not None and a.node_id == node_id and a.state == "released" \
                    and a.generation == generation:
                return 200, {"released": True, "replayed": True}
            verdict = fence(a, node_id, generation, now)
            if verdict is not None:
                code = "job_done" if verdict == "done" else verdict
                return 409, {"error": code, "detail": refusal_detail(code, attempt_id)}
            assert row is not None
            tx.run("UPDATE attempts SET state = 'released', ended_at = ? WHERE attempt_id = ?",
                   (now, attempt_id))
            tx.run("UPDATE jobs SET state = 'queued' WHERE job_id = ? AND attempt_id = ? AND"
                   " state = 'running'", (row["job_id"], attempt_id))
        self._backlog.forget()
        return 200, {"released": True}

    # -- upkeep and figures ----------------------------------------------------------------------

    def purge(self, *, now: float) -> int:
        """Forget jobs whose results expired (with their attempts), and emptied batches."""
        with self.backend.write() as tx:
            ids = [r["job_id"] for r in tx.all("SELECT job_id FROM jobs WHERE expires_at < ?"
                                              " LIMIT 5000", (now,))]
            for i in range(0, len(ids), 500):
                chunk = ids[i:i + 500]
                marks = ", ".join("?" * len(chunk))
                tx.run(f"DELETE FROM attempts WHERE job_id IN ({marks})", chunk)
                tx.run(f"DELETE FROM jobs WHERE job_id IN ({marks})", chunk)
            if ids:
                tx.run("DELETE FROM job_batches WHERE NOT EXISTS (SELECT 1 FROM jobs WHERE"
                       " jobs.batch_id = job_batches.batch_id)")
        return len(ids)

    def queue_depth(self) -> dict[tuple[str, str], int]:
        """Jobs by module and state (queued, running), for /metrics."""
        with self.backend.read(snapshot=False) as tx:
            rows = tx.all("SELECT module, state, COUNT(*) AS n FROM jobs WHERE state IN"
                          " ('queued', 'running') GROUP BY module, state")
        return {(r["module"], r["state"]): int(r["n"]) for r in rows}

