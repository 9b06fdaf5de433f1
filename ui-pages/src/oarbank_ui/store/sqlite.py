"""The embedded store's connections: one SQLite file in WAL mode, created 0600.

Two connections: writes go through one behind a lock (SQLite has one writer anyway), reads
through the other, so a page render never waits on a heartbeat's transaction (WAL lets a
reader see the last commit while a write is under way).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .migrations import check_applied, statements

__all__ = ["SQLiteBackend"]


class _Tx:
    """A cursor with the few calls the store makes (``?`` placeholders, rows as dicts)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def all(self, sql: str, args: Any = ()) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute(sql, args).fetchall()]

    def one(self, sql: str, args: Any = ()) -> dict[str, Any] | None:
        r = self.db.execute(sql, args).fetchone()
        return dict(r) if r is not None else None

    def run(self, sql: str, args: Any = ()) -> int:
        return self.db.execute(sql, args).rowcount

    def many(self, sql: str, rows: list[Any]) -> None:
        if rows:
            self.db.executemany(sql, rows)


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=30)
    db.row_factory = sqlite3.Row
    return db


class SQLiteBackend:
    kind = "sqlite"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)
        # Heartbeats and token hashes are the fleet's: owner-only from the first byte (the
        # -wal and -shm files SQLite makes next to it take the same mode).
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            # (Windows has no such mode bits: its ACLs are the operator's to set)
            if os.name != "nt" and os.fstat(fd).st_mode & 0o077:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        self._wlock = threading.Lock()
        self._rlock = threading.Lock()
        self._w = _connect(self.path)
        try:  # a store that cannot open closes what it opened (the caller gets no object)
            mode = self._w.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise RuntimeError(f"{self.path}: SQLite refused WAL mode (got {mode!r})")
            self._w.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
            self._r = _connect(self.path)
        except BaseException:
            self._w.close()
            raise

    def _migrate(self) -> None:
        db = self._w
        db.execute("BEGIN IMMEDIATE")  # two portals opening one file migrate one at a time
        try:
            db.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY"
                       " KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)")
            applied = {r[0] for r in db.execute("SELECT version FROM schema_migrations")}
            for m in check_applied(self.kind, applied, self.where):
                for stmt in statements(m.sql):
                    db.execute(stmt)
                db.execute("INSERT INTO schema_migrations VALUES (?, ?, ?)",
                           (m.version, m.name, time.time()))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    @contextlib.contextmanager
    def write(self, pipelined: bool = False) -> Iterator[_Tx]:
        """One transaction (``pipelined`` is PostgreSQL's business: here every statement is a
        function call, not a round trip)."""
        with self._wlock:
            self._w.execute("BEGIN IMMEDIATE")
            try:
                yield _Tx(self._w)
            except BaseException:
                self._w.execute("ROLLBACK")
                raise
            self._w.execute("COMMIT")

    @contextlib.contextmanager
    def read(self, snapshot: bool = True) -> Iterator[_Tx]:
        """``snapshot``: one snapshot for several statements (a node list and its modules
        agree); a single statement is consistent on its own and skips BEGIN/COMMIT."""
        with self._rlock:
            if not snapshot:
                yield _Tx(self._r)
                return
            self._r.execute("BEGIN")
            try:
                yield _Tx(self._r)
            finally:
                self._r.execute("COMMIT")

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        yield  # one file, two long-lived connections: nothing to hold per request

    def schema_version(self) -> int:
        with self.read() as tx:
            row = tx.one("SELECT MAX(version) AS v FROM schema_migrations")
        return int(row["v"] or 0) if row else 0

    def close(self) -> None:
        with self._wlock, self._rlock:
            self._w.close()
            self._r.close()
