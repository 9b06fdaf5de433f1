"""The one writer of reports: many nodes' reports in one transaction (group commit,
``group_commit.py``; a report alone, ``HeartbeatStore.record``, is a batch of one),
each checked and answered on its own.

A report either says something new or it does not. The node's row keeps a digest of its last
stored report (everything but its ``time``, ``ingest.report.report_digest``); a report whose
digest matches, and a short "still alive" naming it (``StillAlive``), only refresh the node's
times and fold one more sample into its history bucket from the rows already stored: no
service row is written at all (readers take a row's times from its node, ``schema.services_sql``;
rewriting three rows' times was about 40 % of PostgreSQL's work for such a report). A report
with something new replaces the node's rows.

Every write checks the node's token inside the transaction (``node_tokens``), so a token
revoked or rotated after the portal cached it (``web/reports.py``) is refused at the next
report: ``Outcome.status`` is then ``revoked``.

Outcomes: ``applied``; ``not_applied`` (a later report of the node is stored already);
``revoked``; ``send_full`` (a still-alive whose digest is not the stored one: the node must
send its whole snapshot). Why a report was not stored is decided in one place (``_why_not``).

The steps are written once; only how many statements each takes differs. On PostgreSQL each
is one statement for the whole batch (arrays unnested; the unchanged reports' refresh and fold
a chain of data-modifying CTEs), since every statement is a round trip; on SQLite, whose
statements cost none, a statement per report (``executemany``).
"""

from __future__ import annotations

import json
from typing import Any

from ..ingest.report import Outcome, Report
from ..ingest.validate import NODE_METRICS, Heartbeat, service_metrics
from ..queries.services import iso_utc
from .history import SAMPLE_INSERT, History, sample_conflict, sample_values
from .schema import NODE_COLUMNS, NODE_WON, ROW_COLUMNS

__all__ = ["service_row_values", "write_reports"]

# The token a report came with is still the node's (a join on the token's unique index).
_TOKEN_JOIN = " JOIN node_tokens t ON t.node_id = v.node_id AND t.token_hash = v.token_hash"
_TOKEN_OK = ("EXISTS (SELECT 1 FROM node_tokens t WHERE t.node_id = {node}"
             " AND t.token_hash = {token})")

_FOLD_COLUMNS = ("r.module, r.node_id, r.service, {fine}, {bucket}, r.hostname,"
                 " r.running * (1 - r.agent_stopped),"
                 " r.ready * r.running * (1 - r.agent_stopped),"
                 " CASE WHEN r.agent_stopped = 1 THEN 0 ELSE r.users END, r.rss_bytes, r.loads,"
                 " n.mem_used_bytes, n.mem_reserved_bytes, n.gpu_mem_used_bytes, 1")

# PostgreSQL's array types of each table's columns, for unnest
_PG_NODE_TYPES = ("text", "text", "float8", "float8", "float8", "int4", "int8", "int8", "int8",
                  "int8", "int8", "text")  # NODE_COLUMNS'
_PG_ROW_TYPES = ("text", "text", "text", "text", "text", "int4", "int4", "int4", "text", "text",
                 "int4", "int4", "int4", "text", "int4", "int4", "float8", "text", "float8",
                 "float8", "int4", "int8", "int8")  # ROW_COLUMNS'
_PG_SAMPLE_TYPES = ("text", "text", "text", "int8", "float8", "text", "int8", "int8", "int8",
                    "int8", "int8", "int8", "int8", "int8")  # sample_values'


def service_row_values(hb: Heartbeat, now: float) -> list[tuple[Any, ...]]:
    """A report's service rows, as ROW_COLUMNS' values (received at ``now``)."""
    stopped = int(hb.agent_stopped)
    return [
        (r.module, hb.node_id, r.service, hb.hostname, r.health, int(r.running),
         int(r.ready), int(r.accepting), r.error, r.held, int(r.disabled),
         int(r.withdrawn), int(r.gpu_api_missing), r.lifecycle, r.users,
         int(r.endpoint), hb.time, json.dumps(r.raw, sort_keys=True), now,
         hb.heartbeat_s, stopped, *service_metrics(r).values())
        for r in hb.services
    ]


def _node_values(it: Report, hb: Heartbeat) -> tuple[Any, ...]:
    """A report's node row, as NODE_COLUMNS' values."""
    m = hb.metrics or {}
    return (hb.node_id, hb.hostname, hb.time, it.received_at, hb.heartbeat_s,
            int(hb.agent_stopped), *(m.get(k) for k in NODE_METRICS), it.digest)


def _unnest(types: tuple[str, ...]) -> str:
    return "unnest(" + ", ".join(f"?::{t}[]" for t in types) + ")"


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    """Rows as one list per column (the arrays a statement unnests)."""
    return [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


def _bucket(it: Report, h: History) -> float:
    return float(int(it.received_at // h.fine_s) * h.fine_s)


def _why_not(tx: Any, it: Report) -> Outcome:
    """A report the batch did not store (a still-alive that touched nothing, a whole report
    that did not win its node's upsert): which of the reasons it was."""
    if it.token_hash is not None and tx.one(
            "SELECT 1 AS ok FROM node_tokens WHERE node_id = ? AND token_hash = ?",
            (it.node_id, it.token_hash)) is None:
        return Outcome("revoked", "the token was revoked or replaced")
    prev = tx.one("SELECT received_at FROM nodes WHERE node_id = ?", (it.node_id,))
    if prev is not None and prev["received_at"] > it.received_at:
        return Outcome("not_applied", f"a report of {it.node_id} received later "
                                      f"({iso_utc(prev['received_at'])}) is already stored")
    return Outcome("send_full", "the portal does not hold the report this still-alive "
                                "names; send the whole snapshot")


# -- unchanged reports: the node's times refreshed, one sample folded from the stored rows --

def _touch(tx: Any, kind: str, h: History, items: list[Report]) -> set[str]:
    """The nodes of ``items`` whose stored digest is the report's (and whose token holds):
    refreshed, their samples folded."""
    if kind == "postgresql":
        return _touch_postgres(tx, h, items)
    fold = (f"{SAMPLE_INSERT} SELECT {_FOLD_COLUMNS.format(fine=h.fine_s, bucket='?')}"
            " FROM service_rows r JOIN nodes n ON n.node_id = r.node_id WHERE r.node_id = ?"
            + sample_conflict("sqlite"))
    touched = set()
    for it in items:
        sql = ("UPDATE nodes SET reported_at = ?, received_at = ? WHERE node_id = ?"
               " AND rows_digest = ? AND received_at <= ?")
        args = [it.what.time, it.received_at, it.node_id, it.digest, it.received_at]
        if it.token_hash is not None:
            sql += " AND " + _TOKEN_OK.format(node="nodes.node_id", token="?")
            args.append(it.token_hash)
        if tx.run(sql, args) == 1:
            touched.add(it.node_id)
            tx.run(fold, (_bucket(it, h), it.node_id))
    return touched


def _touch_postgres(tx: Any, h: History, items: list[Report]) -> set[str]:
    checked = "" if items[0].token_hash is None else _TOKEN_JOIN
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
        + _FOLD_COLUMNS.format(fine=h.fine_s, bucket="n.bucket")
        + " FROM service_rows r JOIN touched n ON n.node_id = r.node_id"
        + sample_conflict("postgresql") + ")"
        " SELECT node_id FROM touched")
    rows = tx.all(sql, (
        [it.node_id for it in items], [it.digest for it in items],
        [it.token_hash for it in items], [it.what.time for it in items],
        [it.received_at for it in items], [_bucket(it, h) for it in items]))
    return {r["node_id"] for r in rows}


# -- whole reports with something new: the node's rows replaced --------------------------

def _won(tx: Any, kind: str, items: list[tuple[Report, Heartbeat]]) -> set[str]:
    """The nodes whose upsert took the report: its token holds and no later report of the
    node is stored."""
    if kind == "postgresql":
        checked = "" if items[0][0].token_hash is None else _TOKEN_JOIN
        upsert = (f"INSERT INTO nodes ({NODE_COLUMNS}) SELECT "
                  + ", ".join(f"v.{c}" for c in NODE_COLUMNS.split(", ")) + " FROM "
                  + _unnest((*_PG_NODE_TYPES, "text")) + f" AS v({NODE_COLUMNS}, token_hash)"
                  + checked + NODE_WON)
        values = [(*_node_values(it, hb), it.token_hash) for it, hb in items]
        return {r["node_id"] for r in tx.all(upsert, _columns(values, len(_PG_NODE_TYPES) + 1))}
    marks = ", ".join("?" * len(_PG_NODE_TYPES))
    won = set()
    for it, hb in items:
        # INSERT ... SELECT with a WHERE: SQLite's form of an upsert from a query
        cond, args = ("1 = 1", []) if it.token_hash is None else (
            _TOKEN_OK.format(node="?", token="?"), [it.node_id, it.token_hash])
        sql = f"INSERT INTO nodes ({NODE_COLUMNS}) SELECT {marks} WHERE {cond}" + NODE_WON
        if tx.one(sql, [*_node_values(it, hb), *args]) is not None:
            won.add(it.node_id)
    return won


def _replace_rows(tx: Any, kind: str, h: History, mine: list[tuple[Report, Heartbeat]]) -> None:
    """The won nodes' service rows replaced by their reports' and one sample each folded."""
    nodes = [it.node_id for it, _ in mine]
    rows = [row for it, hb in mine for row in service_row_values(hb, it.received_at)]
    samples = [s for it, hb in mine for s in sample_values(hb, it.received_at, h)]
    if kind == "postgresql":
        tx.run("DELETE FROM service_rows WHERE node_id = ANY(?::text[])", (nodes,))
        if rows:
            tx.run(f"INSERT INTO service_rows ({ROW_COLUMNS}) SELECT * FROM "
                   + _unnest(_PG_ROW_TYPES), _columns(rows, len(_PG_ROW_TYPES)))
            tx.run(f"{SAMPLE_INSERT} SELECT *, 1 FROM " + _unnest(_PG_SAMPLE_TYPES)
                   + sample_conflict("postgresql"), _columns(samples, len(_PG_SAMPLE_TYPES)))
        return
    tx.many("DELETE FROM service_rows WHERE node_id = ?", [(n,) for n in nodes])
    if rows:
        tx.many(f"INSERT INTO service_rows ({ROW_COLUMNS}) VALUES ("
                + ", ".join("?" * len(_PG_ROW_TYPES)) + ")", rows)
        tx.many(f"{SAMPLE_INSERT} VALUES (" + ", ".join("?" * len(_PG_SAMPLE_TYPES)) + ", 1)"
                + sample_conflict("sqlite"), samples)


def write_reports(tx: Any, kind: str, h: History,
                  items: list[Report]) -> tuple[list[Outcome], set[str]]:
    """Inside one write: store ``items`` (distinct nodes, all with a token or none). An
    outcome each, in order, and the modules of the rows written (the history's roll-up visits
    them)."""
    if len({it.node_id for it in items}) != len(items):
        raise ValueError("write_reports: one report per node in a batch")
    if len({it.token_hash is None for it in items}) > 1:
        raise ValueError("write_reports: reports with and without a token in one batch")
    out: dict[str, Outcome] = {}
    # a report kept without a digest (``HeartbeatStore.record``) is never unchanged
    candidates = [it for it in items if it.digest is not None]
    touched = _touch(tx, kind, h, candidates) if candidates else set()
    whole: list[tuple[Report, Heartbeat]] = []  # whole reports with something new
    for it in items:
        if it.node_id in touched:
            out[it.node_id] = Outcome("applied", digest=it.digest)
        elif it.short:
            out[it.node_id] = _why_not(tx, it)
        else:
            whole.append((it, it.heartbeat()))
    modules: set[str] = set()
    if whole:
        won = _won(tx, kind, whole)
        mine = [(it, hb) for it, hb in whole if it.node_id in won]
        for it, _ in whole:
            out[it.node_id] = (Outcome("applied", digest=it.digest) if it.node_id in won
                               else _why_not(tx, it))
        if mine:
            _replace_rows(tx, kind, h, mine)
        modules = {r.module for _, hb in mine for r in hb.services}
    return [out[it.node_id] for it in items], modules
