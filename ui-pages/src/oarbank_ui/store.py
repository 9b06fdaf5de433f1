"""The heartbeat store: SQLite in WAL mode, one file named on the command line.

Each heartbeat is a node's full snapshot: its rows replace that node's previous rows (a module
disabled on the node disappears with its rows), so the table holds the latest row per
(module, node, service) plus ``reported_at`` (the heartbeat's own ``time``). A heartbeat older
than the one stored for its node is not applied (a late retry must not undo a newer report);
``record`` says so to the caller.

One connection guarded by a lock: the portal's request threads share it, and SQLite work here
is a few milliseconds at most.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .heartbeat import Heartbeat
from .services_query import MAX_ROWS, services_row

__all__ = ["HeartbeatStore", "RecordResult"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    node_id     TEXT PRIMARY KEY,
    hostname    TEXT NOT NULL,
    reported_at REAL NOT NULL,
    received_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS service_rows (
    module          TEXT NOT NULL,
    node_id         TEXT NOT NULL,
    service         TEXT NOT NULL,
    hostname        TEXT NOT NULL,
    health          TEXT,
    running         INTEGER NOT NULL,
    ready           INTEGER NOT NULL,
    accepting       INTEGER NOT NULL,
    error           TEXT,
    held            TEXT,
    disabled        INTEGER NOT NULL,
    withdrawn       INTEGER NOT NULL,
    gpu_api_missing INTEGER NOT NULL,
    lifecycle       TEXT NOT NULL,
    users           INTEGER NOT NULL,
    endpoint        INTEGER NOT NULL,
    reported_at     REAL NOT NULL,
    raw             TEXT NOT NULL,
    -- The primary key is the query's index: module first (always given), then the two
    -- optional filters in the order rows are returned.
    PRIMARY KEY (module, node_id, service)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS service_rows_by_node ON service_rows (node_id);
"""


@dataclass(frozen=True)
class RecordResult:
    applied: bool
    reason: str = ""


class HeartbeatStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- writing ---------------------------------------------------------------------------

    def record(self, hb: Heartbeat, *, received_at: float | None = None) -> RecordResult:
        """Store a node's snapshot in one transaction (all or nothing)."""
        now = time.time() if received_at is None else received_at
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                prev = db.execute("SELECT reported_at FROM nodes WHERE node_id = ?",
                                  (hb.node_id,)).fetchone()
                if prev is not None and prev[0] > hb.time:
                    db.execute("ROLLBACK")
                    return RecordResult(False, f"older than the stored report of {hb.node_id} "
                                               f"(time {prev[0]} > {hb.time})")
                db.execute(
                    "INSERT INTO nodes (node_id, hostname, reported_at, received_at)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT(node_id) DO UPDATE SET"
                    " hostname = excluded.hostname, reported_at = excluded.reported_at,"
                    " received_at = excluded.received_at",
                    (hb.node_id, hb.hostname, hb.time, now),
                )
                db.execute("DELETE FROM service_rows WHERE node_id = ?", (hb.node_id,))
                db.executemany(
                    "INSERT INTO service_rows VALUES"
                    " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (r.module, hb.node_id, r.service, hb.hostname, r.health, r.running,
                         r.ready, r.accepting, r.error, r.held, r.disabled, r.withdrawn,
                         r.gpu_api_missing, r.lifecycle, r.users, r.endpoint, hb.time,
                         json.dumps(r.raw, sort_keys=True))
                        for r in hb.services
                    ],
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        return RecordResult(True)

    # -- reading ---------------------------------------------------------------------------

    def services(self, modules: Iterable[str], *, node_id: str | None = None,
                 service: str | None = None, limit: int = MAX_ROWS) -> list[dict[str, Any]]:
        """The ``services`` query: rows of the given module (its id and/or other names it is
        reported under), optionally one node and/or one service, at most ``limit`` (<= 200)."""
        return self.services_page(modules, node_id=node_id, service=service, limit=limit)[0]

    def services_page(self, modules: Iterable[str], *, node_id: str | None = None,
                      service: str | None = None, limit: int = MAX_ROWS
                      ) -> tuple[list[dict[str, Any]], bool]:
        """``services`` and whether more rows matched than ``limit`` (so a caller can say the
        answer was cut instead of dropping rows silently)."""
        names = list(dict.fromkeys(modules))
        if not names:
            return [], False
        limit = max(0, min(limit, MAX_ROWS))
        sql = (f"SELECT * FROM service_rows WHERE module IN ({', '.join('?' * len(names))})")
        args: list[Any] = list(names)
        if node_id is not None:
            sql += " AND node_id = ?"
            args.append(node_id)
        if service is not None:
            sql += " AND service = ?"
            args.append(service)
        sql += " ORDER BY node_id, service LIMIT ?"
        args.append(limit + 1)  # one more than asked: tells whether the answer is cut
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [services_row(dict(r)) for r in rows[:limit]], len(rows) > limit

    def nodes(self) -> list[dict[str, Any]]:
        """Every node that ever reported, with the modules in its latest report."""
        with self._lock:
            nodes = self._db.execute(
                "SELECT node_id, hostname, reported_at, received_at FROM nodes ORDER BY node_id"
            ).fetchall()
            mods = self._db.execute(
                "SELECT DISTINCT node_id, module FROM service_rows ORDER BY node_id, module"
            ).fetchall()
        by_node: dict[str, list[str]] = {}
        for m in mods:
            by_node.setdefault(m["node_id"], []).append(m["module"])
        return [dict(n) | {"modules": by_node.get(n["node_id"], [])} for n in nodes]

    def query_plan(self, module: str) -> str:
        """SQLite's plan for the module-filtered query (tests check it uses the key)."""
        with self._lock:
            rows = self._db.execute(
                "EXPLAIN QUERY PLAN SELECT * FROM service_rows WHERE module IN (?)"
                " ORDER BY node_id, service LIMIT 200", (module,)).fetchall()
        return " | ".join(str(r[-1]) for r in rows)
