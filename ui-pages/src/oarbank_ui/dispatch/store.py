"""The dispatcher's state, all of it in the portal's store (SQLite or PostgreSQL, the tables of
migration 0005): submitters, batches, jobs, attempts with their leases, each node's latest
claim. Nothing the dispatcher decides lives only in a process: a portal killed and started
again, or a second portal on the same PostgreSQL, carries on from the tables.

Each call is one transaction (a node's claims: ``claims.py``, on these tables). PostgreSQL: a
claim takes its jobs with ``FOR UPDATE SKIP LOCKED`` (portals claiming at once take different
jobs, without waiting on each other); rows are locked attempt first, then job, everywhere, so
two transactions never wait on each other in a circle. SQLite: one writer at a time
(``BEGIN IMMEDIATE``).

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
from dataclasses import dataclass
from typing import Any

from ..store.tokens import new_token, token_hash
from .backlog import BacklogCounts
from .jobview import job_view
from .leases import Attempt, fence, refusal_detail
from .protocol import Result, Submission

__all__ = ["DispatchStore", "KeyReused", "new_id"]

FINISHED = ("succeeded", "failed", "cancelled")
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


class DispatchStore:
    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.pg = backend.kind == "postgresql"
        self._lock = " FOR UPDATE" if self.pg else ""
        self.skip = " FOR UPDATE SKIP LOCKED" if self.pg else ""
        # A stage's queue is read in this order: on PostgreSQL only the index of queued rows
        # gives it (migration 0007), never the primary key's walk over the done jobs before them.
        head = "seq + 0" if self.pg else "seq"
        self.queued = (" FROM jobs WHERE state = 'queued' AND module = ? AND stage = ?"
                       f" ORDER BY {head}")  # a stage's queued jobs, oldest first
        self.backlog = BacklogCounts()  # each stage's, shared by this process's claims
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
        self.backlog.forget()
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
        self.backlog.forget()
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
            return any(tx.one(f"SELECT 1 AS x{self.queued} LIMIT 1", p) is not None
                       for p in pairs)

    def expire_in(self, tx: Any, now: float) -> int:
        """Leases past ``expires_at``: the attempt expired, its job queued again (no charge).
        Counted from what the statements return (a pipelined transaction has no row counts)."""
        rows = tx.all("SELECT attempt_id, job_id FROM attempts WHERE state = 'running' AND"
                      " expires_at < ? ORDER BY expires_at LIMIT ?" + self.skip,
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
            n = self.expire_in(tx, now)
        if n:
            self.backlog.forget()
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
            expired = self.expire_in(tx, now)
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
            expired = self.expire_in(tx, now)
            status, answer = self.finish_in(tx, res, now, retention_s)
        return status, answer, expired

    def finish_in(self, tx: Any, res: Result, now: float,
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
        self.backlog.forget()
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

