"""Many nodes' reports in one transaction (group commit, ``ingest.py``), each checked and
answered on its own.

A report either says something new or it does not. The node's row keeps a digest of its last
stored report (everything but its ``time``, ``report_digest``); a report whose digest matches,
and a short "still alive" naming it (``StillAlive``), only refresh the node's times and fold
one more sample into its history bucket from the rows already stored: no row is deleted,
re-encoded or inserted. A report with something new replaces the node's rows as before
(store.py's ``write_full``).

Every write checks the node's token inside the transaction (``node_tokens``), so a token
revoked or rotated after the portal cached it (ingest.py) is refused at the next report:
``Outcome.status`` is then ``revoked``.

Outcomes: ``applied``; ``not_applied`` (a later report of the node is stored already);
``revoked``; ``send_full`` (a still-alive whose digest is not the stored one: the node must
send its whole snapshot).

On PostgreSQL the unchanged reports of a batch are one statement (arrays unnested into a
chain of data-modifying CTEs); on SQLite a few C-level statements each.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .heartbeat import Heartbeat, StillAlive
from .services_query import iso_utc
from .store_metrics import sample_conflict

if TYPE_CHECKING:
    from .store import HeartbeatStore

__all__ = ["Outcome", "Report", "record_batch", "report_digest"]


def report_digest(doc: dict[str, Any]) -> str:
    """The digest of a decoded full report, all but its ``time`` (keys sorted)."""
    rest = {k: v for k, v in doc.items() if k != "time"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


@dataclass(frozen=True)
class Report:
    """One node's report, checked and ready to store."""

    what: Heartbeat | StillAlive
    digest: str  # the full report's own digest, or the one a still-alive names
    received_at: float
    token_hash: str | None = None  # None: no token check (in-process callers, tests)

    @property
    def node_id(self) -> str:
        return self.what.node_id


@dataclass(frozen=True)
class Outcome:
    status: str  # applied | not_applied | revoked | send_full
    reason: str = ""
    digest: str | None = None  # applied: what a still-alive may name next

    @property
    def applied(self) -> bool:
        return self.status == "applied"


_TOKEN_OK = ("EXISTS (SELECT 1 FROM node_tokens t WHERE t.node_id = {node}"
             " AND t.token_hash = {token})")

_SQLITE_TOUCH = ("UPDATE nodes SET reported_at = ?, received_at = ? WHERE node_id = ?"
                 " AND rows_digest = ? AND received_at <= ?")
_SQLITE_ROWS = "UPDATE service_rows SET reported_at = ?, received_at = ? WHERE node_id = ?"
_FOLD_COLUMNS = ("r.module, r.node_id, r.service, {fine}, {bucket}, r.hostname,"
                 " r.running * (1 - r.agent_stopped),"
                 " r.ready * r.running * (1 - r.agent_stopped),"
                 " CASE WHEN r.agent_stopped = 1 THEN 0 ELSE r.users END, r.rss_bytes, r.loads,"
                 " n.mem_used_bytes, n.mem_reserved_bytes, n.gpu_mem_used_bytes, 1")
_INSERT_SAMPLES = ("INSERT INTO node_samples (module, node_id, service, res_s, t, hostname,"
                   " running, ready, users, rss_bytes, loads, mem_used_bytes,"
                   " mem_reserved_bytes, gpu_mem_used_bytes, samples)")


def _touch_sqlite(tx: Any, store: HeartbeatStore, items: list[Report]) -> set[str]:
    fine = store.history.fine_s
    fold = (f"{_INSERT_SAMPLES} SELECT {_FOLD_COLUMNS.format(fine=fine, bucket='?')}"
            " FROM service_rows r JOIN nodes n ON n.node_id = r.node_id WHERE r.node_id = ?"
            + sample_conflict("sqlite"))
    touched = set()
    for it in items:
        sql, args = _SQLITE_TOUCH, [it.what.time, it.received_at, it.node_id, it.digest,
                                    it.received_at]
        if it.token_hash is not None:
            sql += " AND " + _TOKEN_OK.format(node="nodes.node_id", token="?")
            args.append(it.token_hash)
        if tx.run(sql, args) != 1:
            continue
        touched.add(it.node_id)
        tx.run(_SQLITE_ROWS, (it.what.time, it.received_at, it.node_id))
        tx.run(fold, (float(int(it.received_at // fine) * fine), it.node_id))
    return touched


def _touch_postgres(tx: Any, store: HeartbeatStore, items: list[Report]) -> set[str]:
    fine = store.history.fine_s
    if len({it.token_hash is None for it in items}) > 1:
        raise ValueError("record_batch: reports with and without a token in one batch")
    # the token, checked by its unique index (a join, not a subquery over every token)
    checked = "" if items[0].token_hash is None else (
        " JOIN node_tokens t ON t.node_id = v.node_id AND t.token_hash = v.token_hash")
    # the planner takes the unnested handful for as many rows as the tables: it would scan
    # nodes and service_rows whole for each batch; their indexes are the way in
    tx.run("SET LOCAL enable_seqscan = off")
    # one statement for the whole batch: which nodes say nothing new, their times refreshed,
    # their rows' times too, one sample each folded in; node ids are distinct in a batch, so
    # no row is touched twice (ON CONFLICT would refuse that)
    sql = (
        "WITH v AS (SELECT * FROM unnest(?::text[], ?::text[], ?::text[], ?::float8[],"
        " ?::float8[], ?::float8[]) AS v(node_id, digest, token_hash, reported_at,"
        " received_at, bucket)),"
        " touched AS (UPDATE nodes n SET reported_at = v.reported_at,"
        " received_at = v.received_at FROM v" + checked + " WHERE n.node_id = v.node_id"
        " AND n.rows_digest = v.digest AND n.received_at <= v.received_at"
        " RETURNING n.node_id, v.bucket, n.mem_used_bytes, n.mem_reserved_bytes,"
        " n.gpu_mem_used_bytes),"
        " r AS (UPDATE service_rows s SET reported_at = v.reported_at,"
        " received_at = v.received_at FROM v, touched t WHERE s.node_id = t.node_id"
        " AND v.node_id = t.node_id RETURNING s.*),"
        f" folded AS ({_INSERT_SAMPLES} SELECT "
        + _FOLD_COLUMNS.format(fine=fine, bucket="n.bucket")
        + " FROM r JOIN touched n ON n.node_id = r.node_id"
        + sample_conflict("postgresql") + ")"
        " SELECT node_id FROM touched")
    rows = tx.all(sql, (
        [it.node_id for it in items], [it.digest for it in items],
        [it.token_hash for it in items], [it.what.time for it in items],
        [it.received_at for it in items],
        [float(int(it.received_at // fine) * fine) for it in items]))
    return {r["node_id"] for r in rows}


def _why_not(tx: Any, it: Report) -> Outcome:
    """A report that changed nothing: which of the reasons it was (the rare path)."""
    if it.token_hash is not None and tx.one(
            "SELECT 1 AS ok FROM node_tokens WHERE node_id = ? AND token_hash = ?",
            (it.node_id, it.token_hash)) is None:
        return Outcome("revoked", "the token was revoked or replaced")
    prev = tx.one("SELECT received_at, rows_digest FROM nodes WHERE node_id = ?",
                  (it.node_id,))
    if prev is not None and prev["received_at"] > it.received_at:
        return Outcome("not_applied", f"a report of {it.node_id} received later "
                                      f"({iso_utc(prev['received_at'])}) is already stored")
    return Outcome("send_full", "the portal does not hold the report this still-alive "
                                "names; send the whole snapshot")


def record_batch(store: HeartbeatStore, items: list[Report]) -> list[Outcome]:
    """Store ``items`` (distinct nodes) in one transaction; an outcome each, in order."""
    if len({it.node_id for it in items}) != len(items):
        raise ValueError("record_batch: one report per node in a batch")
    out: dict[str, Outcome] = {}
    with store.backend.write(pipelined=True) as tx:
        touch = _touch_postgres if store.kind == "postgresql" else _touch_sqlite
        touched = touch(tx, store, items)
        for it in items:
            if it.node_id in touched:
                out[it.node_id] = Outcome("applied", digest=it.digest)
            elif isinstance(it.what, StillAlive):
                out[it.node_id] = _why_not(tx, it)
            elif it.token_hash is not None and tx.one(
                    "SELECT 1 AS ok FROM node_tokens WHERE node_id = ? AND token_hash = ?",
                    (it.node_id, it.token_hash)) is None:
                out[it.node_id] = Outcome("revoked", "the token was revoked or replaced")
            else:
                won = store.write_full(tx, it.what, it.received_at, it.digest)
                out[it.node_id] = won if won is not None else Outcome("applied",
                                                                      digest=it.digest)
    store.after_write(time.time())
    return [out[it.node_id] for it in items]
