"""Group commit with a queue bounded in time: the portal's one writer of heartbeats, and of
claims (``dispatch/http.py``: the same writer, its items claims and their grants).

Requests hand their checked report to ``GroupCommit.submit``; one thread per portal process
takes every report waiting (distinct nodes, at most ``max_batch``), stores them in one
transaction (the ``write`` it is given: ``HeartbeatStore.record_batch``) and only then settles
each report's future: a report is answered after its commit, never before. While a batch is
written the next one gathers, so the busier the portal, the more reports share a commit.

The linger: a batch's first report waits up to ``linger_s`` (25 ms) for others to join it,
but only while reports arrive faster than that (``linger_for``): a lone report on a quiet
portal is written at once. Why 25 ms: a transaction has a fixed cost (its statements' round
trips and planning, the commit, the writer's wake-ups; about 0.8 ms of portal and PostgreSQL
CPU together) besides each report's own (about 0.1 ms). At 1,000 reports/s on two workers a
2 ms linger left one or two reports a transaction, 10 ms about 7, 25 ms about 16: portal and
PostgreSQL CPU per report 0.62-0.68 ms at 10 ms, 0.44-0.46 ms at 25 ms as agents send
(docs/measurements/2026-12-04-portal-report-path.md, fourth and fifth passes), for up to 25 ms
more on each answer, far inside the bound (p99 from due 30-47 ms).

The queue is measured in time, not count: ``age()`` is how long the oldest report not yet
committed has waited (the one being written included). Past ``admit_fraction`` of the bound a
new report is refused before it is parsed (``overloaded()``: the portal answers 503 with
Retry-After); one that waited past ``drop_fraction`` of it when its batch starts is answered
the same way, unwritten. So no answer waits much past the bound, and a refused report loses
nothing: the node's next report is its whole snapshot.

States of a report: queued --(taken in time)--> written --(commit)--> settled with its
Outcome; queued --(taken too late)--> settled ``overloaded``; a batch whose transaction fails
is written again one report per transaction, so one bad report fails only itself (unless the
first of them fails too: then the store is down, and all are answered 503 at once).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["GroupCommit", "admits", "linger_for", "mean_gap", "DEFAULT_LINGER_S"]

log = logging.getLogger("oarbank_ui.ingest")

DEFAULT_LINGER_S = 0.025

T = TypeVar("T")  # what a request hands in (a checked report, a claim)
R = TypeVar("R")  # what it gets back once committed (its Outcome, its grants)


def admits(age_s: float, bound_s: float, fraction: float) -> bool:
    """Whether a report joins a queue whose oldest entry has waited ``age_s``."""
    return age_s < bound_s * fraction


GAP_WEIGHT = 0.2  # of the newest gap in the moving mean: about the last ten arrivals count


def mean_gap(mean_s: float | None, gap_s: float) -> float:
    """The moving mean of the time between arrivals, with one more gap."""
    return gap_s if mean_s is None else mean_s + GAP_WEIGHT * (gap_s - mean_s)


def linger_for(mean_gap_s: float | None, linger_s: float) -> float:
    """How long a batch's first report waits for others: ``linger_s`` while reports arrive
    within it of each other on average, else nothing (no one is expected to join)."""
    return linger_s if mean_gap_s is not None and mean_gap_s < linger_s else 0.0


@dataclass
class _Pending(Generic[T, R]):
    item: T
    queued: float  # monotonic
    future: asyncio.Future[R] | concurrent.futures.Future[R]
    loop: asyncio.AbstractEventLoop | None  # None: a concurrent future (a blocking caller)


class GroupCommit(Generic[T, R]):
    """``key``: whose item it is (one per batch: a node's second waits, in order);
    ``failed``: the answer to an item whose transaction raised; ``late``: to one taken past
    the drop (given the seconds it may wait)."""

    def __init__(self, write: Callable[[list[T]], list[R]], *, key: Callable[[T], str],
                 failed: Callable[[Exception], R], late: Callable[[float], R],
                 bound_s: float = 1.0, max_batch: int = 1000,
                 admit_fraction: float = 0.5, drop_fraction: float = 0.8,
                 linger_s: float = DEFAULT_LINGER_S,
                 on_batch: Callable[[int, float], None] | None = None,
                 on_settled: Callable[[list[tuple[T, R]]], None] | None = None,
                 ) -> None:
        self.write = write  # a batch in one transaction: an outcome each, in order
        self.key = key
        self.failed = failed
        self.late = late
        self.bound_s = bound_s
        self.max_batch = max_batch
        self.linger_s = linger_s
        self.admit_fraction = admit_fraction
        self.drop_fraction = drop_fraction
        self._on_batch = on_batch  # (reports committed, seconds the batch took)
        # a batch's outcomes, once, on the loop that answers them, before any answer goes out
        # (counters folded per batch: one metrics write per figure, not one per report)
        self._on_settled = on_settled
        self._cond = threading.Condition()
        self._queue: deque[_Pending[T, R]] = deque()
        self._writing_since: float | None = None  # the oldest report of the batch being written
        self._last_arrival: float | None = None
        self._mean_gap: float | None = None  # between arrivals (mean_gap), for linger_for
        self._closing = False
        self._thread: threading.Thread | None = None

    # -- the requests' side ----------------------------------------------------------------

    def age(self) -> float:
        with self._cond:
            return self._age(time.monotonic())

    def _age(self, now: float) -> float:
        oldest = [t for t in (self._writing_since,
                              self._queue[0].queued if self._queue else None) if t is not None]
        return now - min(oldest) if oldest else 0.0

    def overloaded(self) -> bool:
        return not admits(self.age(), self.bound_s, self.admit_fraction)

    def submit(self, item: T, future: asyncio.Future[R] | concurrent.futures.Future[R],
               loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Queue ``item``; ``future`` gets its outcome (on ``loop`` when given)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("the portal is stopping")
            if self._thread is None:  # started here, in the serving process (after a fork)
                self._thread = threading.Thread(target=self._run, name="group-commit",
                                                daemon=True)
                self._thread.start()
            now = time.monotonic()
            if self._last_arrival is not None:
                self._mean_gap = mean_gap(self._mean_gap, now - self._last_arrival)
            self._last_arrival = now
            self._queue.append(_Pending(item, now, future, loop))
            if len(self._queue) == 1 or len(self._queue) >= self.max_batch:
                self._cond.notify()  # the writer waits for a first report, or lingers

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(10)

    # -- the writer ------------------------------------------------------------------------

    def _take(self) -> tuple[list[_Pending[T, R]], list[_Pending[T, R]]] | None:
        """The next batch (distinct keys, oldest first) and the items taken too late."""
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            # linger: the batch's first report waits for others to join it while they come
            # (a commit per report or two cost a transaction's whole overhead each)
            deadline = self._queue[0].queued + linger_for(self._mean_gap, self.linger_s)
            while len(self._queue) < self.max_batch and not self._closing:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            now = time.monotonic()
            batch: list[_Pending[T, R]] = []
            late: list[_Pending[T, R]] = []
            keys: set[str] = set()
            while self._queue and len(batch) < self.max_batch:
                p = self._queue[0]
                if self.key(p.item) in keys:
                    break  # a node's second item waits for the next batch: order kept
                self._queue.popleft()
                if now - p.queued > self.bound_s * self.drop_fraction:
                    late.append(p)
                    continue
                keys.add(self.key(p.item))
                batch.append(p)
            self._writing_since = batch[0].queued if batch else None
            return batch, late

    def _run(self) -> None:
        while (taken := self._take()) is not None:
            batch, late = taken
            over = self.late(self.bound_s * self.drop_fraction)
            _settle([(p, over) for p in late], self._on_settled)
            if batch:
                started = time.monotonic()
                _settle(list(zip(batch, self._write(batch), strict=True)), self._on_settled)
                with self._cond:
                    self._writing_since = None
                if self._on_batch is not None:
                    self._on_batch(len(batch), time.monotonic() - started)

    def _write(self, batch: list[_Pending[T, R]]) -> list[R]:
        try:
            return self.write([p.item for p in batch])
        except Exception as e:
            if len(batch) == 1:
                log.exception("%s: the store refused it", self.key(batch[0].item))
                return [self.failed(e)]
            log.warning("a batch of %d failed (%s: %s); writing them one by one",
                        len(batch), type(e).__name__, e)
            error = e
        try:  # the first alone: when it fails too, the store itself is failing
            out = self.write([batch[0].item])
        except Exception as e:
            log.exception("%s: the store refused it", self.key(batch[0].item))
            return [self.failed(e)] + [self.failed(error)] * (len(batch) - 1)
        return out + [self._write([p])[0] for p in batch[1:]]


def _settle(done: list[tuple[_Pending[T, R], R]],
            on_settled: Callable[[list[tuple[T, R]]], None] | None) -> None:
    """Give each item its outcome: one wake-up per event loop, not one per item."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Pending[T, R], R]]] = {}
    blocking: list[tuple[_Pending[T, R], R]] = []
    for p, outcome in done:
        (blocking if p.loop is None else by_loop.setdefault(p.loop, [])).append((p, outcome))
    if blocking:
        _settle_on_loop(blocking, on_settled)
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_on_loop, items, on_settled)
        except RuntimeError:  # the loop closed: nobody waits for these answers any more
            pass


def _settle_on_loop(items: list[tuple[_Pending[T, R], R]],
                    on_settled: Callable[[list[tuple[T, R]]], None] | None) -> None:
    # a request that gave up (its bound passed, its client went away) is settled already
    live = [(p, outcome) for p, outcome in items if not p.future.done()]
    if on_settled is not None and live:
        on_settled([(p.item, outcome) for p, outcome in live])
    for p, outcome in live:
        p.future.set_result(outcome)
