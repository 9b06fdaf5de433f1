"""Idle keep-alive connections that ``request()`` reuses, one bounded pool per service.

Rules:

- a connection is put back only after its whole response was read and the service did not
  say it would close it; at most ``MAX_IDLE`` wait per service, the rest are closed;
- one taken from the pool is checked first: one the service has closed meanwhile (idle
  timeout, or ``ended`` at the attempt's end: the service's acceptor cuts what is left of an
  attempt) or that holds bytes nobody asked for is closed, and the next one is tried;
- thread-safe (one lock per pool; a connection is used by one thread at a time, the one that
  took it); a forked child drops its copies of the parent's idle connections (closing its
  descriptors only: the parent's connections stay up) and starts with empty pools.

Standard library only.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from typing import Protocol

__all__ = ["MAX_IDLE", "Pool", "pool_for", "close_all", "looks_closed", "readable_now"]

# Idle connections kept per service. Each is open on the service side too (a worker thread
# of serve_http waits on it) and counts against its acceptor's per-attempt cap (64).
MAX_IDLE = 8


class Reusable(Protocol):
    sock: socket.socket | None

    def close(self) -> None: ...


def readable_now(sock: socket.socket) -> bool:
    """Whether reading ``sock`` would not block now (data, end of file or an error waits).
    A poll with no timeout: a socket with a timeout set would wait in ``recv`` even with
    MSG_DONTWAIT (Python polls for it first). A Windows pipe stream peeks instead (select
    takes only sockets there)."""
    peek = getattr(sock, "readable_now", None)
    if peek is not None:
        return bool(peek())
    if hasattr(select, "poll"):
        p = select.poll()
        p.register(sock, select.POLLIN)
        return bool(p.poll(0))
    return bool(select.select([sock], [], [], 0)[0])


def looks_closed(sock: socket.socket | None) -> bool:
    """Whether an idle connection cannot carry a request: the peer closed it (end of file),
    broke it, or sent bytes nobody asked for (none of which may be read as the answer to
    our next request). Nothing is consumed."""
    if sock is None or sock.fileno() < 0:
        return True
    return readable_now(sock)


class Pool:
    """The idle connections to one service (through one connector)."""

    def __init__(self, max_idle: int = MAX_IDLE) -> None:
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[Reusable] = []

    def take(self) -> Reusable | None:
        """The most recently used idle connection that still looks open, or None."""
        while True:
            with self._lock:
                if not self._idle:
                    return None
                conn = self._idle.pop()
            if not looks_closed(conn.sock):
                return conn
            conn.close()

    def give(self, conn: Reusable) -> None:
        """Keep ``conn`` for the next request, or close it when the pool is full."""
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


_lock = threading.Lock()
_pools: dict[tuple[str, str], Pool] = {}


def pool_for(service: str, connector: str) -> Pool:
    """The pool of ``service`` reached through the connector named ``connector``."""
    with _lock:
        pool = _pools.get((service, connector))
        if pool is None:
            pool = _pools[(service, connector)] = Pool()
        return pool


def close_all() -> None:
    """Close every idle connection of every pool (and forget the pools)."""
    global _pools
    with _lock:
        pools, _pools = _pools, {}
    for pool in pools.values():
        pool.close()


def _after_fork_in_child() -> None:
    global _lock, _pools
    pools, _lock, _pools = _pools, threading.Lock(), {}
    for pool in pools.values():
        # Our copies only: close() without shutdown leaves the parent's connections up. The
        # pool's lock may have been held by a parent thread at fork time: not taken here.
        for conn in pool._idle:
            conn.close()


if hasattr(os, "register_at_fork"):  # not on Windows, where nothing forks
    os.register_at_fork(after_in_child=_after_fork_in_child)
