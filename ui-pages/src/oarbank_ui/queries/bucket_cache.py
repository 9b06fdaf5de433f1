"""Answers of the fleet over time (``node_metrics`` grouped by ``t``), kept per bucket once the
bucket can no longer change, so a chart of 10,000 nodes over a day reads from the store only
the buckets that still can: the newest ones and the ones at the fine/coarse boundary.

A bucket is settled when
- it is a fine one (at or after the roll-up edge plus a coarse bucket) whose end is at least
  one fine bucket ago: no report is folded into it any more; or
- it is a coarse one at least a coarse bucket older than the edge of a roll-up this process
  has run: its fine samples are gone, its coarse sample is written once.
The cache remembers the spans in which it holds every settled bucket (an empty bucket is kept
as its absence); everything else in the question's range, and the hours of a bucket whose
zone changed since it was kept, is read from the store again. The cache is per process and
per question (module names, params, aggregates), at most ``MAX_KEYS`` questions, least
recently asked dropped first.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["MAX_KEYS", "BucketCache"]

MAX_KEYS = 64
Window = tuple[float, float]


class BucketCache:
    def __init__(self, fine_s: int, fine_keep_s: int, coarse_s: int, retention_s: int) -> None:
        self.fine_s, self.fine_keep_s = fine_s, fine_keep_s
        self.coarse_s, self.retention_s = coarse_s, retention_s
        self.compacted_edge = -math.inf  # the edge of the last roll-up this process ran
        self._lock = threading.Lock()
        # question -> (spans whose settled buckets are all kept, t -> (zone, row))
        self._data: OrderedDict[Any, tuple[list[Window], dict[float, tuple[str, dict[str, Any]]]]] \
            = OrderedDict()

    def edge(self, now: float) -> float:
        return float(int((now - self.fine_keep_s) // self.coarse_s) * self.coarse_s)

    def _zone(self, t: float, now: float) -> str:
        return "fine" if t >= self.edge(now) else "coarse"

    def _settled_spans(self, now: float) -> list[Window]:
        """Where every bucket (by its start) is settled now: old coarse ones, and fine ones
        that ended at least a fine bucket ago."""
        edge = self.edge(now)
        return [(-math.inf, min(edge, self.compacted_edge) - self.coarse_s),
                (edge + self.coarse_s, now - 2 * self.fine_s + 1e-6)]

    def answer(self, key: Any, since: float, now: float,
               fetch: Callable[[list[Window]], list[dict[str, Any]]]) -> list[dict[str, Any]]:
        """The rows (one per ``t``, in time order) from ``since``; ``fetch(windows)`` reads the
        store for the ``[start, end)`` windows given."""
        with self._lock:
            known, kept = self._data.get(key, ([], {}))
        floor = now - self.retention_s
        fresh = {t: v for t, v in kept.items() if v[0] == self._zone(t, now) and t >= floor}
        moved = [t for t in kept if t not in fresh and t >= floor]
        settled = self._settled_spans(now)
        known = _intersect(known, settled)
        if moved:  # kept as fine buckets, rolled up since: read their hours again
            lo = float(int(min(moved) // self.coarse_s) * self.coarse_s)
            known = _subtract(known, [(lo, max(moved) + self.coarse_s)])
        windows = _subtract([(since, math.inf)], known)
        live = {float(r["t"]): r for r in fetch(windows)} if windows else {}
        rows = {t: row for t, (_, row) in fresh.items()
                if t >= since and not _inside(t, windows)}
        rows.update(live)
        keep = {t: v for t, v in fresh.items() if _inside(t, known)}
        keep.update({t: (self._zone(t, now), r) for t, r in live.items()
                     if _inside(t, settled)})
        known = _union(known, _intersect([(since, math.inf)], settled))
        with self._lock:
            self._data[key] = (known, keep)
            self._data.move_to_end(key)
            while len(self._data) > MAX_KEYS:
                self._data.popitem(last=False)
        return [rows[t] for t in sorted(rows)]


def _inside(t: float, spans: list[Window]) -> bool:
    return any(a <= t < b for a, b in spans)


def _union(a: list[Window], b: list[Window]) -> list[Window]:
    out: list[Window] = []
    for lo, hi in sorted(x for x in a + b if x[0] < x[1]):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _intersect(a: list[Window], b: list[Window]) -> list[Window]:
    return _union([], [(max(x0, y0), min(x1, y1)) for x0, x1 in a for y0, y1 in b])


def _subtract(a: list[Window], b: list[Window]) -> list[Window]:
    out = _union([], a)
    for y0, y1 in _union([], b):
        nxt: list[Window] = []
        for x0, x1 in out:
            if y1 <= x0 or y0 >= x1:
                nxt.append((x0, x1))
                continue
            if x0 < y0:
                nxt.append((x0, y0))
            if y1 < x1:
                nxt.append((y1, x1))
        out = nxt
    return out
