"""The fleet store's connections: PostgreSQL through psycopg 3 and its connection pool.

Several portal processes may share one database: every write is one transaction, the
ordering check is part of the node's upsert (heartbeats.py), and migrations run under an advisory
lock so two portals starting together apply each one once.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

from .migrations import check_applied

__all__ = ["PostgresBackend", "redact"]

_MIGRATION_LOCK = 0x0A7BA4C  # pg_advisory_xact_lock key: "oarbank" migrations
# A connection idle this long is checked (one round trip) before it serves a request: after a
# server restart the pool's old connections are dead. One in steady use is not: a check per
# request would be a round trip per request.
_CHECK_IDLE_S = 1.0


def redact(url: str) -> str:
    """The URL without its password (for messages and logs)."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def _q(sql: str) -> str:
    # The store writes SQLite's ``?``; psycopg wants ``%s`` (no literal % or ? in our SQL).
    return sql.replace("?", "%s")


class _Tx:
    def __init__(self, cur: Any) -> None:
        self.cur = cur

    def all(self, sql: str, args: Any = ()) -> list[dict[str, Any]]:
        self.cur.execute(_q(sql), args)
        return list(self.cur.fetchall())

    def one(self, sql: str, args: Any = ()) -> dict[str, Any] | None:
        self.cur.execute(_q(sql), args)
        row: dict[str, Any] | None = self.cur.fetchone()
        return row

    def run(self, sql: str, args: Any = ()) -> int:
        self.cur.execute(_q(sql), args)
        return int(self.cur.rowcount)

    def many(self, sql: str, rows: list[Any]) -> None:
        if rows:
            self.cur.executemany(_q(sql), rows)


class _PipelinedTx:
    """Statements queued in psycopg's pipeline mode: sent together, waited for only when a
    result is read (``one``/``all``) and at COMMIT. A heartbeat is then two round trips (the
    node's upsert, whose answer decides; its rows and the commit) instead of six. A cursor per
    statement: a result read later must still be its own."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @property
    def cur(self) -> Any:
        return self.conn.cursor()

    def all(self, sql: str, args: Any = ()) -> list[dict[str, Any]]:
        cur = self.cur
        cur.execute(_q(sql), args)
        return list(cur.fetchall())

    def one(self, sql: str, args: Any = ()) -> dict[str, Any] | None:
        cur = self.cur
        cur.execute(_q(sql), args)
        row: dict[str, Any] | None = cur.fetchone()
        return row

    def run(self, sql: str, args: Any = ()) -> int:
        self.cur.execute(_q(sql), args)
        return -1  # not known before the pipeline syncs; callers that need it do not pipeline

    def many(self, sql: str, rows: list[Any]) -> None:
        if rows:
            self.cur.executemany(_q(sql), rows)


class PostgresBackend:
    kind = "postgresql"

    def __init__(self, url: str, *, min_size: int = 2, max_size: int = 10,
                 timeout_s: float = 3.0, open_timeout_s: float = 15.0) -> None:
        import psycopg
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        self.where = redact(url)
        self._psycopg = psycopg
        # timeout_s: how long a request waits for a connection; then it is answered 503 (the
        # agent's post gives up after 5 s: an answer must come before that)
        self._used: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._local = threading.local()  # session(): this thread's checked-out connection
        # autocommit: a single read is one round trip; writes open their own transaction
        self._pool = ConnectionPool(url, min_size=min_size, max_size=max_size, timeout=timeout_s,
                                    kwargs={"row_factory": dict_row, "autocommit": True},
                                    open=False, name="oarbank-portal", check=self._check)
        try:
            # wait(): a wrong URL or a server that is down fails here, with its reason, not on
            # the first heartbeat.
            self._pool.open(wait=True, timeout=open_timeout_s)
            self._migrate()
        except Exception:
            self._pool.close()
            raise

    def _migrate(self) -> None:
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            cur.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY"
                        " KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)")
            cur.execute("SELECT version FROM schema_migrations")
            applied = {r["version"] for r in cur.fetchall()}
            for m in check_applied(self.kind, applied, self.where):
                cur.execute(m.sql)  # a script without parameters: psycopg runs it whole
                cur.execute("INSERT INTO schema_migrations VALUES (%s, %s, %s)",
                            (m.version, m.name, time.time()))

    def _check(self, conn: Any) -> None:
        """A dropped connection (a server restart) is replaced on checkout instead of failing
        the request it would serve; only connections idle for a while are asked."""
        last = self._used.get(conn)
        now = time.monotonic()
        if last is None or now - last > _CHECK_IDLE_S:
            self._pool.check_connection(conn)  # raises: the pool replaces it
        self._used[conn] = now

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """One connection for every read and write of this thread until the block ends: a
        heartbeat's token lookup and its write share one checkout."""
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        with self._pool.connection() as conn:
            self._local.conn = conn
            try:
                yield
            finally:
                self._local.conn = None

    @contextlib.contextmanager
    def _conn(self) -> Iterator[Any]:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            yield conn
            return
        with self._pool.connection() as conn:
            yield conn

    @contextlib.contextmanager
    def write(self, pipelined: bool = False) -> Iterator[_Tx | _PipelinedTx]:
        """One transaction; ``pipelined``: statements go out together (``run`` then answers
        -1: only for callers that do not need its row count)."""
        if pipelined:
            with self._conn() as conn:
                yield from self._pipelined(conn)
            return
        with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            yield _Tx(cur)

    def _pipelined(self, conn: Any) -> Iterator[_PipelinedTx]:
        """BEGIN and COMMIT as statements of the pipeline: the one wait is the pipeline's end
        (psycopg's ``transaction()`` in a pipeline syncs before its COMMIT and after it: two
        round trips more a transaction). Whatever fails, what is left of it is rolled back."""
        try:
            with conn.pipeline():
                conn.execute("BEGIN")
                yield _PipelinedTx(conn)
                conn.execute("COMMIT")
        except BaseException:
            try:
                if conn.info.transaction_status != self._psycopg.pq.TransactionStatus.IDLE:
                    conn.execute("ROLLBACK")
            except self._psycopg.Error:
                pass  # (a broken connection: the pool discards it; the first error is the one)
            raise

    @contextlib.contextmanager
    def read(self, snapshot: bool = True) -> Iterator[_Tx]:
        # REPEATABLE READ: one snapshot for a read of several statements.
        if not snapshot:
            with self._conn() as conn, conn.cursor() as cur:
                yield _Tx(cur)
            return
        with self._conn() as conn:
            conn.isolation_level = self._psycopg.IsolationLevel.REPEATABLE_READ
            try:
                with conn.transaction(), conn.cursor() as cur:
                    yield _Tx(cur)
            finally:
                conn.isolation_level = None

    def schema_version(self) -> int:
        with self.read() as tx:
            row = tx.one("SELECT MAX(version) AS v FROM schema_migrations")
        return int(row["v"] or 0) if row else 0

    def close(self) -> None:
        self._pool.close()
