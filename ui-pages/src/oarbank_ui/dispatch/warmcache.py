"""Where each service is warm, as one portal process last read it from the nodes' claims
(``claim_offers``), for ``WARM_TTL_S``: what ``offers.Warmth`` says for a claim.

Read per claim, the warmth was a sum over every node's offer (about half of a claim's time at
1,000 nodes, and growing with the fleet). One read now serves this process's claims for
``WARM_TTL_S``, kept per node so that a claim leaves out the claiming node's own offer
exactly; the offers this process records meanwhile replace that node's part at once (so two
claims of one process never see a node in two states). Another process's claims reach it
within ``WARM_TTL_S``. Copies granted cold and not yet in any claim are read fresh per claim
(``claims.Claims._cold``): the count that keeps claims answered together from each starting
a copy does not wait for this cache.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .offers import Warmth

__all__ = ["WARM_TTL_S", "Offer", "WarmCache"]

WARM_TTL_S = 0.1


class Offer(NamedTuple):
    """One node's latest word on one service."""

    state: str
    tokens: int
    job_s: float | None
    load_s: float | None


Key = tuple[str, str]  # (module, service)


class _Sums:
    """One service's offers summed over nodes, so that a claim's read is O(1): tokens where
    it is ready or starting, of those starting, and the job and load times' sums and counts."""

    __slots__ = ("warm", "starting", "job_sum", "job_n", "load_sum", "load_n")

    def __init__(self) -> None:
        self.warm = self.starting = self.job_n = self.load_n = 0
        self.job_sum = self.load_sum = 0.0

    def add(self, o: Offer, sign: int = 1) -> None:
        if o.state in ("ready", "starting"):
            self.warm += sign * o.tokens
            if o.state == "starting":
                self.starting += sign * o.tokens
        if o.job_s is not None:
            self.job_sum += sign * o.job_s
            self.job_n += sign
        if o.load_s is not None:
            self.load_sum += sign * o.load_s
            self.load_n += sign

    def without(self, o: Offer | None) -> Warmth:
        """The sums less one node's offer (the claiming node's: its own is not warmth)."""
        warm, starting = self.warm, self.starting
        job_sum, job_n, load_sum, load_n = self.job_sum, self.job_n, self.load_sum, self.load_n
        if o is not None:
            if o.state in ("ready", "starting"):
                warm -= o.tokens
                starting -= o.tokens if o.state == "starting" else 0
            if o.job_s is not None:
                job_sum, job_n = job_sum - o.job_s, job_n - 1
            if o.load_s is not None:
                load_sum, load_n = load_sum - o.load_s, load_n - 1
        return Warmth(warm, starting, job_sum / job_n if job_n > 0 else None,
                      load_sum / load_n if load_n > 0 else None)


class WarmCache:
    def __init__(self, ttl_s: float = WARM_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._read_at: float | None = None
        self._modules: frozenset[str] = frozenset()
        self._offers: dict[Key, dict[str, Offer]] = {}  # (module, service) -> node -> offer
        self._sums: dict[Key, _Sums] = {}

    @property
    def modules(self) -> frozenset[str]:
        """The modules the last read covered (a read for one more reads them too)."""
        with self._lock:
            return self._modules

    def covers(self, modules: Iterable[str], t: float) -> bool:
        """Whether a read at monotonic time ``t`` can be answered from the cache."""
        with self._lock:
            return (self._read_at is not None and t - self._read_at < self.ttl_s
                    and self._modules.issuperset(modules))

    def fill(self, rows: Iterable[Mapping[str, Any]], modules: Iterable[str], t: float) -> None:
        """Every fresh offer of ``modules`` (rows of ``claim_offers``), read at ``t``."""
        offers: dict[Key, dict[str, Offer]] = {}
        sums: dict[Key, _Sums] = {}
        for r in rows:
            key = (r["module"], r["service"])
            o = Offer(r["state"], int(r["tokens"] or 0), _num(r["job_s"]), _num(r["load_s"]))
            offers.setdefault(key, {})[r["node_id"]] = o
            sums.setdefault(key, _Sums()).add(o)
        with self._lock:
            self._offers, self._sums = offers, sums
            self._modules, self._read_at = frozenset(modules), t

    def record(self, node_id: str, offers: Mapping[Key, Offer]) -> None:
        """The node's new claim (recorded by this process): its offers replace its old ones."""
        with self._lock:
            for key, per_node in self._offers.items():
                old = per_node.pop(node_id, None)
                if old is not None:
                    self._sums[key].add(old, -1)
            for key, o in offers.items():
                if key[0] in self._modules:
                    self._offers.setdefault(key, {})[node_id] = o
                    self._sums.setdefault(key, _Sums()).add(o)

    def forget(self) -> None:
        with self._lock:
            self._read_at = None

    def warmth(self, node_id: str, modules: Iterable[str]) -> dict[Key, Warmth]:
        """Each service of ``modules`` on the other nodes: tokens where it is ready or
        starting, of those starting, and the mean job and load times they measured."""
        wanted = set(modules)
        with self._lock:
            return {key: sums.without(self._offers[key].get(node_id))
                    for key, sums in self._sums.items()
                    if key[0] in wanted and len(self._offers[key]) - (
                        node_id in self._offers[key]) > 0}


def _num(v: Any) -> float | None:
    return None if v is None else float(v)
