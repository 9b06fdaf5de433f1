"""A stage's backlog as one portal process counts it for its claims.

Placement only needs the count to be large enough to decide a cold start (10.5), so it is
counted up to ``BACKLOG_CAP`` queued rows, and one process's claims share a count for
``BACKLOG_TTL_S``, less what they granted since. Jobs queued again or newly (here) make the
next claim count afresh. Whether a stage has work at all is still read by every claim.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["BACKLOG_CAP", "BACKLOG_TTL_S", "BacklogCounts"]

BACKLOG_CAP = 10_000
BACKLOG_TTL_S = 0.05

Stage = tuple[str, str]  # (module, stage)


class BacklogCounts:
    def __init__(self) -> None:
        self._counts: dict[Stage, tuple[int, float]] = {}  # -> (count, monotonic time)
        self._lock = threading.Lock()  # claims run on the server's worker threads

    def count(self, stage: Stage, read: Callable[[], int]) -> int:
        """This process's count if recent, else ``read()`` (the store's, up to the cap)."""
        t = time.monotonic()
        with self._lock:
            hit = self._counts.get(stage)
        if hit is not None and t - hit[1] < BACKLOG_TTL_S:
            return hit[0]
        n = read()
        with self._lock:
            self._counts[stage] = (n, t)
        return n

    def granted(self, stage: Stage, n: int) -> None:
        with self._lock:
            hit = self._counts.get(stage)
            if hit is not None:
                self._counts[stage] = (max(1, hit[0] - n), hit[1])

    def forget(self) -> None:
        with self._lock:
            self._counts.clear()
