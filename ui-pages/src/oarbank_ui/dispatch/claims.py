"""A node's claim in the store (contract 10.4): the claims that came together, one transaction
for all (the group commit's batch, ``dispatch/http.py``). For each: its token checked, the
results it carries finished (as a result alone would be: ``DispatchStore.finish_in``), its
offer recorded, then its grants: the head of each stage it offers read once and locked
(PostgreSQL: ``FOR UPDATE SKIP LOCKED``, so portals claiming at once take different jobs),
placement's decision (``choose``) taken on it, an attempt made for each job granted.

Kept per portal process: the nodes' warmth (``warmcache.py``, read only for a claim that
weighs a cold start: ``offers.needs_fleet``) and each node's offer as this process last wrote
it (a claim repeating it within ``OFFER_REWRITE_S`` is not written again). A transaction that
fails forgets both, and the backlog counts, so that nothing of it is believed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .backlog import BACKLOG_CAP
from .offers import Warmth, needs_fleet
from .placement import Pick
from .protocol import Claim, Result
from .store import DispatchStore
from .warmcache import Offer, WarmCache

__all__ = ["ClaimWork", "Claimed", "Claims"]

OFFER_FRESH_S = 90.0  # a node's claim (or renew) this recent tells where a service is warm
OFFER_REWRITE_S = 5.0  # an offer the same as the one this process wrote this recently: kept
# a cold grant still live counts as a copy starting until its node's claim shows the service;
# one older than this is no start any more (and bounds the rows the query reads)
COLD_HORIZON_S = 3600.0

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


class Claims:
    def __init__(self, store: DispatchStore) -> None:
        self.store = store
        self._warmth = WarmCache()  # the nodes' offers, read once per WARM_TTL_S (warmcache.py)
        # node -> (its offer as this process last wrote it, when): a claim saying the same
        # again soon after is not written again (_record_offer)
        self._offered: dict[str, tuple[tuple[Any, ...], float]] = {}

    def batch(self, works: Sequence[ClaimWork], *, now: float, lease_s: float,
              retention_s: float) -> list[Claimed]:
        """Each claim's grants, in one transaction (the group commit's batch: one commit,
        one expiry of leases, for the claims that came together). Leases expired here are
        counted in the first claim's ``Claimed``. A failure rolls all of it back, and what
        this process keeps of the store (the backlog counts, the warmth read) is read again."""
        try:  # pipelined (PostgreSQL): a statement whose answer is not read is not waited for
            with self.store.backend.write(pipelined=True) as tx:
                expired = self.store.expire_in(tx, now)
                if expired:
                    self.store.backlog.forget()
                nodes = self._token_nodes(tx, [w.token_hash for w in works if w.token_hash])
                out = [self._claim(tx, w, nodes, now, lease_s, retention_s) for w in works]
        except BaseException:
            self.store.backlog.forget()
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
        finished = [self.store.finish_in(tx, res, now, retention_s) for res in w.results]
        if w.first:
            self._record_offer(tx, claim, now)
        queue: dict[tuple[str, str], tuple[int, float]] = {}
        heads: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for module, stage in w.pairs:
            # the stage's head, as many jobs as the claim could take, locked now (PostgreSQL:
            # those another portal holds are skipped): its oldest's wait for placement, its
            # rows the grants (one read where there were two; what is not granted stays
            # queued, its lock gone at the commit)
            rows = tx.all(f"SELECT job_id, payload, generation, submitted_at{self.store.queued}"
                          " LIMIT ?" + self.store.skip, (module, stage, max(1, claim.max_grants)))
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
            self.store.backlog.granted((p.module, p.stage), len(rows))
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
            n = tx.one(f"SELECT COUNT(*) AS n FROM (SELECT 1 AS x{self.store.queued} LIMIT ?) q",
                       (module, stage, BACKLOG_CAP))
            return int(n["n"]) if n else 0

        return self.store.backlog.count((module, stage), read)

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
