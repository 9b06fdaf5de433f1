"""The heartbeat store: the same queries over SQLite (embedded, one file) or PostgreSQL (a
server several portal replicas share). ``open_store(where)`` picks by the argument:
``postgresql://...`` (or ``postgres://``) or a file path.

Each heartbeat is a node's full snapshot: its rows replace that node's previous rows (a module
disabled on the node disappears with its rows). Reports are ordered by the time the portal
*received* them (contract 6.2), not by the node's own ``time``: a node whose clock runs ahead,
or a report with a far-future time, can no longer freeze the node's rows. The check is part of
the node's upsert (``... DO UPDATE ... WHERE stored.received_at <= new``), so two replicas
receiving two reports of one node at once still keep the later one. The node's ``time`` stays
as ``reported_at`` for display.

The writing is ``write.py``'s (one writer for a report alone and a batch); the tables' columns
``schema.py``'s. Tokens: one per node, only its SHA-256 kept (``tokens.py``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..ingest.report import Outcome, Report
from ..ingest.validate import Heartbeat
from ..queries import nodes as node_queries
from ..queries.bucket_cache import BucketCache
from ..queries.services import MAX_ROWS, is_stale, iso_utc, services_row
from ..queries.shape import Shaping
from .history import History, compact_samples
from .schema import services_sql
from .tokens import new_token, token_hash
from .write import write_reports

__all__ = ["ALL_ROWS", "HeartbeatStore", "MAX_NODES_PAGE", "RecordResult", "StoreBackend",
           "is_postgres_url", "open_store"]

MAX_NODES_PAGE = 1000
# services_page(limit=ALL_ROWS): every row of the module, for a source that aggregates them
# (a count over the fleet must not stop at the 200 rows a page may list)
ALL_ROWS = 10**9


class _Tx(Protocol):
    def all(self, sql: str, args: Any = ...) -> list[dict[str, Any]]: ...
    def one(self, sql: str, args: Any = ...) -> dict[str, Any] | None: ...
    def run(self, sql: str, args: Any = ...) -> int: ...
    def many(self, sql: str, rows: list[Any]) -> None: ...


class StoreBackend(Protocol):
    kind: str
    where: str

    def write(self, pipelined: bool = False) -> Any: ...
    def read(self, snapshot: bool = True) -> Any: ...
    def session(self) -> Any: ...
    def schema_version(self) -> int: ...
    def close(self) -> None: ...


@dataclass(frozen=True)
class RecordResult:
    applied: bool
    reason: str = ""


def is_postgres_url(where: str) -> bool:
    return where.startswith(("postgresql://", "postgres://"))


def open_store(where: str | Path, *, history: History | None = None,
               **pool: Any) -> HeartbeatStore:
    """``postgresql://user@host/db`` -> PostgreSQL; anything else is an SQLite file."""
    if isinstance(where, str) and is_postgres_url(where):
        from .postgres import PostgresBackend

        return HeartbeatStore(PostgresBackend(where, **pool), history=history)
    return HeartbeatStore(where, history=history)


class HeartbeatStore:
    def __init__(self, backend: StoreBackend | str | Path, *,
                 history: History | None = None) -> None:
        if isinstance(backend, (str, Path)):
            from .sqlite import SQLiteBackend

            backend = SQLiteBackend(backend)
        self.backend = backend
        self.history = history or History()
        self._compacted_at = 0.0
        self._sample_modules: set[str] | None = None  # None: not compacted in this process yet
        h = self.history
        self.buckets = BucketCache(h.fine_s, h.fine_keep_s, h.coarse_s, h.retention_s)

    @property
    def kind(self) -> str:
        return self.backend.kind

    def close(self) -> None:
        self.backend.close()

    def session(self) -> Any:
        """A block whose reads and writes share one connection (PostgreSQL: one pool
        checkout per request instead of one per statement group)."""
        return self.backend.session()

    # -- heartbeats ------------------------------------------------------------------------

    def record(self, hb: Heartbeat, *, received_at: float | None = None) -> RecordResult:
        """Store a node's snapshot in one transaction (all or nothing), without a token check
        (in-process callers): a batch of one."""
        now = time.time() if received_at is None else received_at
        got = self.record_batch([Report(hb, None, now)], now=now)[0]
        return RecordResult(True) if got.applied else RecordResult(False, got.reason)

    def record_batch(self, items: list[Report], *, now: float | None = None) -> list[Outcome]:
        """Store ``items`` (distinct nodes) in one transaction (``write.py``); an outcome
        each, in order. ``now``: the clock the history's roll-up goes by (default: this
        process's)."""
        # pipelined: the statements and the commit go to PostgreSQL in one round trip
        with self.backend.write(pipelined=True) as tx:
            outcomes, modules = write_reports(tx, self.kind, self.history, items)
        if self._sample_modules is not None:  # the modules the history's roll-up visits
            self._sample_modules.update(modules)
        self.after_write(time.time() if now is None else now)
        return outcomes

    def after_write(self, now: float) -> None:
        """After a report's commit: the history's roll-up, at most once a minute."""
        if now - self._compacted_at >= self.history.compact_every_s:
            self._compacted_at = now
            self.compact(now=now)

    def compact(self, *, now: float | None = None) -> dict[str, int]:
        """Roll aged samples up and drop expired ones (``history.compact_samples``)."""
        t = time.time() if now is None else now
        with self.backend.write() as tx:
            seen = sorted(self._sample_modules) if self._sample_modules is not None else None
            done = compact_samples(tx, self.kind, t, self.history, seen)
            if self._sample_modules is None:
                self._sample_modules = set()
                self._sample_modules.update(r["module"] for r in tx.all(
                    "SELECT DISTINCT module FROM service_rows"))
        self.buckets.compacted_edge = self.buckets.edge(t)  # rolled up to here
        return done

    def remove_node(self, node_id: str) -> dict[str, int]:
        """Forget a node: its report, its rows and its token. Counts of what went."""
        with self.backend.write() as tx:
            rows = tx.run("DELETE FROM service_rows WHERE node_id = ?", (node_id,))
            tx.run("DELETE FROM node_samples WHERE node_id = ?", (node_id,))
            nodes = tx.run("DELETE FROM nodes WHERE node_id = ?", (node_id,))
            tokens = tx.run("DELETE FROM node_tokens WHERE node_id = ?", (node_id,))
        return {"nodes": nodes, "rows": rows, "tokens": tokens}

    # -- credentials -----------------------------------------------------------------------

    def issue_token(self, node_id: str, *, now: float | None = None) -> tuple[str, bool]:
        """A new token for ``node_id`` (replacing its previous one): (token, replaced)."""
        token = new_token()
        with self.backend.write() as tx:
            replaced = tx.run("DELETE FROM node_tokens WHERE node_id = ?", (node_id,)) > 0
            tx.run("INSERT INTO node_tokens (node_id, token_hash, issued_at) VALUES (?, ?, ?)",
                   (node_id, token_hash(token), time.time() if now is None else now))
        return token, replaced

    def issue_tokens(self, node_ids: list[str]) -> dict[str, str]:
        """New tokens for many nodes in one transaction (a fleet's first enrolment; the
        benchmark's 10,000 nodes): node id -> token. Replaces the nodes' previous tokens."""
        tokens = {n: new_token() for n in dict.fromkeys(node_ids)}
        now = time.time()
        with self.backend.write() as tx:
            tx.many("DELETE FROM node_tokens WHERE node_id = ?", [(n,) for n in tokens])
            tx.many("INSERT INTO node_tokens (node_id, token_hash, issued_at) VALUES (?, ?, ?)",
                    [(n, token_hash(t), now) for n, t in tokens.items()])
        return tokens

    def revoke_token(self, node_id: str) -> bool:
        with self.backend.write() as tx:
            return tx.run("DELETE FROM node_tokens WHERE node_id = ?", (node_id,)) > 0

    def tokens(self) -> list[dict[str, Any]]:
        """Nodes holding a token and when it was issued (never the hash)."""
        with self.backend.read() as tx:
            return tx.all("SELECT node_id, issued_at FROM node_tokens ORDER BY node_id")

    def node_for_token(self, token: str) -> str | None:
        with self.backend.read(snapshot=False) as tx:
            row = tx.one("SELECT node_id FROM node_tokens WHERE token_hash = ?",
                         (token_hash(token),))
        return None if row is None else str(row["node_id"])

    def token_nodes(self, *, limit: int) -> dict[str, str]:
        """Node ids by token hash, at most ``limit`` of them (the portal's token cache)."""
        with self.backend.read(snapshot=False) as tx:
            rows = tx.all("SELECT token_hash, node_id FROM node_tokens LIMIT ?", (limit,))
        return {str(r["token_hash"]): str(r["node_id"]) for r in rows}

    # -- reading ---------------------------------------------------------------------------

    def services(self, modules: Iterable[str], *, node_id: str | None = None,
                 service: str | None = None, limit: int = MAX_ROWS,
                 now: float | None = None) -> list[dict[str, Any]]:
        """The ``services`` query: rows of the given module (its id and/or other names it is
        reported under), optionally one node and/or one service, at most ``limit`` (<= 200)."""
        return self.services_page(modules, node_id=node_id, service=service, limit=limit,
                                  now=now)[0]

    def services_page(self, modules: Iterable[str], *, node_id: str | None = None,
                      service: str | None = None, limit: int = MAX_ROWS,
                      now: float | None = None) -> tuple[list[dict[str, Any]], bool]:
        """``services`` and whether more rows matched than ``limit`` (so a caller can say the
        answer was cut instead of dropping rows silently). ``now`` judges liveness (default:
        this process's clock)."""
        names = list(dict.fromkeys(modules))
        if not names:
            return [], False
        limit = max(0, min(limit, MAX_ROWS)) if limit != ALL_ROWS else limit
        where = f"module IN ({', '.join('?' * len(names))})"
        args: list[Any] = list(names)
        if node_id is not None:
            where += " AND node_id = ?"
            args.append(node_id)
        if service is not None:
            where += " AND service = ?"
            args.append(service)
        sql = services_sql(where)
        args.append(limit + 1)  # one more than asked: tells whether the answer is cut
        with self.backend.read(snapshot=False) as tx:
            rows = tx.all(sql, args)
        t = time.time() if now is None else now
        return [services_row(r, t) for r in rows[:limit]], len(rows) > limit

    def host_query(self, query: str, modules: Iterable[str], params: dict[str, Any],
                   shaping: Shaping, *, now: float | None = None) -> list[dict[str, Any]]:
        """The ``nodes`` or ``node_metrics`` host query for a module (its names), shaped;
        ``QueryError`` for a bad parameter or field (``queries/nodes.py``)."""
        names = list(dict.fromkeys(modules))
        if not names:
            return []
        t = time.time() if now is None else now
        with self.backend.read() as tx:
            if query == "nodes":
                return node_queries.nodes_query(tx, names, params, shaping, t)
            return node_queries.node_metrics(tx, names, params, shaping, t, self.buckets)

    def nodes(self, *, now: float | None = None, limit: int = MAX_NODES_PAGE,
              after: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        """Nodes in node_id order after ``after``, at most ``limit``, each with the modules
        of its latest report and its liveness; and the ``after`` of the next page (None: last
        page)."""
        limit = max(1, min(limit, MAX_NODES_PAGE))
        cond, args = ("WHERE node_id > ?", [after]) if after is not None else ("", [])
        with self.backend.read() as tx:
            nodes = tx.all("SELECT node_id, hostname, reported_at, received_at, heartbeat_s,"
                           f" agent_stopped FROM nodes {cond} ORDER BY node_id LIMIT ?",
                           [*args, limit + 1])
            page = nodes[:limit]
            mods: list[dict[str, Any]] = []
            if page:
                mods = tx.all("SELECT DISTINCT node_id, module FROM service_rows WHERE"
                              " node_id >= ? AND node_id <= ? ORDER BY node_id, module",
                              (page[0]["node_id"], page[-1]["node_id"]))
        by_node: dict[str, list[str]] = {}
        for m in mods:
            by_node.setdefault(m["node_id"], []).append(m["module"])
        t = time.time() if now is None else now
        out = [_node_view(n, by_node.get(n["node_id"], []), t) for n in page]
        return out, (page[-1]["node_id"] if len(nodes) > limit else None)

    def summary(self, *, now: float | None = None) -> dict[str, Any]:
        """What /metrics shows: nodes by liveness, service rows by module, state and reason
        (grouped in SQL; a few dozen groups whatever the fleet's size)."""
        t = time.time() if now is None else now
        with self.backend.read() as tx:
            nodes = tx.all("SELECT agent_stopped, received_at < ? - 3 * heartbeat_s AS stale,"
                           " COUNT(*) AS n FROM nodes GROUP BY 1, 2", (t,))
            groups = tx.all(
                "SELECT s.module, s.running, s.ready, s.held, s.disabled, s.withdrawn,"
                " s.gpu_api_missing, s.agent_stopped,"
                " n.received_at < ? - 3 * s.heartbeat_s AS stale, COUNT(*) AS n"
                " FROM service_rows s JOIN nodes n ON n.node_id = s.node_id"
                " GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9", (t,))
        live = {"reporting": 0, "stale": 0, "stopped": 0}
        for n in nodes:
            key = "stopped" if n["agent_stopped"] else "stale" if n["stale"] else "reporting"
            live[key] += int(n["n"])
        services: dict[tuple[str, str, str], int] = {}
        for g in groups:
            # received_at/heartbeat_s chosen so services_row judges exactly as SQL did
            row = services_row(g | {"node_id": "", "hostname": "", "service": "", "health": None,
                                    "error": None, "lifecycle": "", "users": 0, "endpoint": 0,
                                    "reported_at": 0, "received_at": 0,
                                    "heartbeat_s": 0 if g["stale"] else 1e18}, t)
            group = (g["module"], row["state"], _reason_label(row["stopped_reason"]))
            services[group] = services.get(group, 0) + int(g["n"])
        return {"nodes": live, "services": services}

    def health(self) -> dict[str, Any]:
        """A round trip to the store: ``{"store": kind, "schema": version}`` or raises."""
        return {"store": self.kind, "schema": self.backend.schema_version()}

    def query_plan(self, module: str) -> str:
        """The store's plan for the module-filtered query (tests check it uses the key)."""
        with self.backend.read() as tx:
            sql = services_sql("module IN (?)")
            if self.kind == "sqlite":
                rows = tx.all(f"EXPLAIN QUERY PLAN {sql}", (module, 200))
                return " | ".join(str(r["detail"]) for r in rows)
            rows = tx.all(f"EXPLAIN {sql}", (module, 200))
            return " | ".join(str(next(iter(r.values()))) for r in rows)


def _reason_label(reason: str | None) -> str:
    # Metrics labels must stay few: the stale reason carries a time, cut it off.
    if reason is None:
        return ""
    return "node not reporting" if reason.startswith("node not reporting") else reason


def _node_view(n: dict[str, Any], modules: list[str], now: float) -> dict[str, Any]:
    stale = is_stale(n["received_at"], n["heartbeat_s"], now)
    if n["agent_stopped"]:
        liveness = "agent stopped"
    elif stale:
        liveness = f"not reporting (last report {iso_utc(n['received_at'])})"
    else:
        liveness = "reporting"
    return {"node_id": n["node_id"], "hostname": n["hostname"],
            "reported_at": n["reported_at"], "received_at": n["received_at"],
            "heartbeat_s": n["heartbeat_s"], "agent_stopped": bool(n["agent_stopped"]),
            "stale": bool(stale and not n["agent_stopped"]), "liveness": liveness,
            "modules": modules}
