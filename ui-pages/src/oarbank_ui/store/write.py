"""Many nodes' reports in one transaction (group commit, ``ingest/group_commit.py``), each checked and
answered on its own.

A report either says something new or it does not. The node's row keeps a digest of its last
stored report (everything but its ``time``, ``report_digest``); a report whose digest matches,
and a short "still alive" naming it (``StillAlive``), only refresh the node's times and fold
one more sample into its history bucket from the rows already stored: no service row is
written at all (readers take a row's times from its node, heartbeats.py's ``services_sql``;
rewriting three rows' times was about 40 % of PostgreSQL's work for such a report). A report
with something new replaces the node's rows as before (heartbeats.py's ``write_full``).

Every write checks the node's token inside the transaction (``node_tokens``), so a token
revoked or rotated after the portal cached it (web/reports.py) is refused at the next report:
``Outcome.status`` is then ``revoked``.

Outcomes: ``applied``; ``not_applied`` (a later report of the node is stored already);
``revoked``; ``send_full`` (a still-alive whose digest is not the stored one: the node must
send its whole snapshot).

On PostgreSQL the unchanged reports of a batch are one statement (arrays unnested into a
chain of data-modifying CTEs), and its whole reports with something new a statement per table
for all of them; on SQLite a few C-level statements each.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..ingest.validate import NODE_METRICS, Heartbeat, StillAlive, parse_heartbeat
from ..queries.nodes import SAMPLE_INSERT, sample_conflict, sample_values
from ..queries.services import iso_utc

if TYPE_CHECKING:
    from .heartbeats import HeartbeatStore

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
    # A whole report whose digest this portal stored before: ``what`` is its StillAlive
    # (heartbeat.parse_unchanged) and this its document, parsed only if the store no longer
    # holds that digest (another portal stored something newer, the node was removed).
    whole: dict[str, Any] | None = None

    @property
    def node_id(self) -> str:
        return self.what.node_id

    @property
    def short(self) -> bool:
        """Whether the node sent a short still-alive (not its whole report)."""
        return isinstance(self.what, StillAlive) and self.whole is None

    def heartbeat(self) -> Heartbeat:
        """The whole report (parsed now if it stood as unchanged)."""
        if isinstance(self.what, Heartbeat):
            return self.what
        assert self.whole is not None, "a short still-alive has no whole report"
        return parse_heartbeat(self.whole)


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
_FOLD_COLUMNS = ("r.module, r.node_id, r.service, {fine}, {bucket}, r.hostname,"
                 " r.running * (1 - r.agent_stopped),"
                 " r.ready * r.running * (1 - r.agent_stopped),"
                 " CASE WHEN r.agent_stopped = 1 THEN 0 ELSE r.users END, r.rss_bytes, r.loads,"
                 " n.mem_used_bytes, n.mem_reserved_bytes, n.gpu_mem_used_bytes, 1")


def _touch_sqlite(tx: Any, store: HeartbeatStore, items: list[Report]) -> set[str]:
    fine = store.history.fine_s
    fold = (f"{SAMPLE_INSERT} SELECT {_FOLD_COLUMNS.format(fine=fine, bucket='?')}"
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
    # one sample per row folded in; node ids are distinct in a batch, so no sample is touched
    # twice (ON CONFLICT would refuse that)
    sql = (
        "WITH v AS (SELECT * FROM unnest(?::text[], ?::text[], ?::text[], ?::float8[],"
        " ?::float8[], ?::float8[]) AS v(node_id, digest, token_hash, reported_at,"
        " received_at, bucket)),"
        " touched AS (UPDATE nodes n SET reported_at = v.reported_at,"
        " received_at = v.received_at FROM v" + checked + " WHERE n.node_id = v.node_id"
        " AND n.rows_digest = v.digest AND n.received_at <= v.received_at"
        " RETURNING n.node_id, v.bucket, n.mem_used_bytes, n.mem_reserved_bytes,"
        " n.gpu_mem_used_bytes),"
        f" folded AS ({SAMPLE_INSERT} SELECT "
        + _FOLD_COLUMNS.format(fine=fine, bucket="n.bucket")
        + " FROM service_rows r JOIN touched n ON n.node_id = r.node_id"
        + sample_conflict("postgresql") + ")"
        " SELECT node_id FROM touched")
    rows = tx.all(sql, (
        [it.node_id for it in items], [it.digest for it in items],
        [it.token_hash for it in items], [it.what.time for it in items],
        [it.received_at for it in items],
        [float(int(it.received_at // fine) * fine) for it in items]))
    return {r["node_id"] for r in rows}


# The batch's whole reports on PostgreSQL: a statement per table for all of them (arrays
# unnested), not a handful per report; the same upsert, ordering check and token check as
# heartbeats.py's write_full, which SQLite keeps (its statements cost no round trip).
_PG_NODE_TYPES = ("text", "text", "float8", "float8", "float8", "int4", "int8", "int8", "int8",
                  "int8", "int8", "text")  # NODE_COLUMNS'
_PG_ROW_TYPES = ("text", "text", "text", "text", "text", "int4", "int4", "int4", "text", "text",
                 "int4", "int4", "int4", "text", "int4", "int4", "float8", "text", "float8",
                 "float8", "int4", "int8", "int8")  # ROW_COLUMNS'
_PG_SAMPLE_TYPES = ("text", "text", "text", "int8", "float8", "text", "int8", "int8", "int8",
                    "int8", "int8", "int8", "int8", "int8")  # sample_values'


def _unnest(types: tuple[str, ...]) -> str:
    return "unnest(" + ", ".join(f"?::{t}[]" for t in types) + ")"


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows as one list per column (the arrays a statement unnests)."""
    return [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


def _write_full_postgres(tx: Any, store: HeartbeatStore,
                         items: list[tuple[Report, Heartbeat]]) -> dict[str, Outcome]:
    from .heartbeats import NODE_COLUMNS, NODE_WON, ROW_COLUMNS, service_row_values

    # the nodes' values, then each report's token hash (the join keeps those that match)
    nodes = [(hb.node_id, hb.hostname, hb.time, it.received_at, hb.heartbeat_s,
              int(hb.agent_stopped), *((hb.metrics or {}).get(k) for k in NODE_METRICS),
              it.digest, it.token_hash)
             for it, hb in items]
    checked = "" if items[0][0].token_hash is None else (
        " JOIN node_tokens t ON t.node_id = v.node_id AND t.token_hash = v.token_hash")
    columns = NODE_COLUMNS.split(", ")
    upsert = (f"INSERT INTO nodes ({NODE_COLUMNS}) SELECT "
              + ", ".join(f"v.{c}" for c in columns) + " FROM "
              + _unnest((*_PG_NODE_TYPES, "text")) + f" AS v({NODE_COLUMNS}, token_hash)"
              + checked + NODE_WON)
    won = {r["node_id"] for r in tx.all(upsert, _columns(nodes, len(_PG_NODE_TYPES) + 1))}
    out = {it.node_id: _why_not(tx, it) for it, _ in items if it.node_id not in won}
    mine = [(it, hb) for it, hb in items if it.node_id in won]
    if not mine:
        return out
    tx.run("DELETE FROM service_rows WHERE node_id = ANY(?::text[])",
           ([it.node_id for it, _ in mine],))
    rows = [row for it, hb in mine for row in service_row_values(hb, it.received_at)]
    if rows:
        tx.run(f"INSERT INTO service_rows ({ROW_COLUMNS}) SELECT * FROM "
               + _unnest(_PG_ROW_TYPES), _columns(rows, len(_PG_ROW_TYPES)))
        samples = [s for it, hb in mine for s in sample_values(hb, it.received_at,
                                                                store.history)]
        tx.run(f"{SAMPLE_INSERT} SELECT *, 1 FROM " + _unnest(_PG_SAMPLE_TYPES)
               + sample_conflict("postgresql"), _columns(samples, len(_PG_SAMPLE_TYPES)))
    for it, hb in mine:
        store.saw_modules(hb)
        out[it.node_id] = Outcome("applied", digest=it.digest)
    return out


def _write_full_sqlite(tx: Any, store: HeartbeatStore,
                       items: list[tuple[Report, Heartbeat]]) -> dict[str, Outcome]:
    out: dict[str, Outcome] = {}
    for it, hb in items:
        if it.token_hash is not None and tx.one(
                "SELECT 1 AS ok FROM node_tokens WHERE node_id = ? AND token_hash = ?",
                (it.node_id, it.token_hash)) is None:
            out[it.node_id] = Outcome("revoked", "the token was revoked or replaced")
            continue
        won = store.write_full(tx, hb, it.received_at, it.digest)
        out[it.node_id] = won if won is not None else Outcome("applied", digest=it.digest)
    return out


def _why_not(tx: Any, it: Report) -> Outcome:
    """A report the batch did not store (a still-alive that touched nothing, a whole report
    that did not win its node's upsert): which of the reasons it was (the rare path)."""
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
        postgres = store.kind == "postgresql"
        touched = (_touch_postgres if postgres else _touch_sqlite)(tx, store, items)
        whole: list[tuple[Report, Heartbeat]] = []  # whole reports with something new
        for it in items:
            if it.node_id in touched:
                out[it.node_id] = Outcome("applied", digest=it.digest)
            elif it.short:
                out[it.node_id] = _why_not(tx, it)
            else:
                whole.append((it, it.heartbeat()))
        if postgres and whole:
            out.update(_write_full_postgres(tx, store, whole))
        elif whole:
            out.update(_write_full_sqlite(tx, store, whole))
    store.after_write(time.time())
    return [out[it.node_id] for it in items]
