"""Demand eviction (pure): which idle services to stop so that a job waiting for memory fits.

A node's memory is a warm cache. When the first job admission holds back for memory (the
node's budget, or GPU memory) would fit once idle services were gone, the cheapest set of
them is stopped (stop reason ``evicted``) and the job is admitted once they are down.

Rules:

- **Never evicted**: a service with users, a non-``yieldable`` one, a pinned one
  (``lifecycle = "always"``; ``manual`` ones are never ours to stop), a held one, one that
  frees none of what is short, and one the waiting job itself reserves.
- **No thrash**: a service that became ready less than its own load time ago is not evicted
  yet; if it would make the difference, the answer says when to ask again (``wake_in_s``).
- **Cheapest** = least expected reload cost: ``load_s * (1 + uses)``, where ``load_s`` is
  the service's measured load time (start to ready, kept across runs) and ``uses`` its use
  count decayed by its age (each use halves in weight every ``USE_HALF_LIFE_S``): a service
  used often and lately is the one most likely to be wanted again soon.
- Among the sets that free enough of every short resource, the least total cost wins; then
  the fewest services; then the key order (deterministic). Nothing is stopped unless the
  whole shortfall can be freed: a partial eviction would cost reloads and admit nothing.

The agent gathers the inputs and acts (``evictor.py``); this module only decides.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["USE_HALF_LIFE_S", "EXHAUSTIVE_MAX", "Idle", "Plan", "decayed_uses", "reload_cost",
           "not_evictable", "choose"]

USE_HALF_LIFE_S = 600.0  # a use's weight halves in this long (the seed's idle_timeout_s)
EXHAUSTIVE_MAX = 12  # up to this many candidates every set is tried (4096); beyond: greedy
_EPS = 1e-9


@dataclass(frozen=True)
class Idle:
    """A service as demand eviction sees it."""

    key: str  # "<module id>/<service>"
    frees: Mapping[str, float]  # resource -> amount stopping it gives back ("mem_gb", ...)
    load_s: float  # its measured load time (start to ready)
    ready_for_s: float  # seconds since it became ready
    uses: float = 0.0  # decayed use count now (``decayed_uses``)
    users: int = 0
    yieldable: bool = True
    lifecycle: str = "on_demand"
    held: bool = False
    ready: bool = True  # READY with no effect in flight (a start or a stop)


@dataclass(frozen=True)
class Plan:
    victims: tuple[str, ...] = ()  # stop these now
    wake_in_s: float | None = None  # ask again then (a young service will be old enough)
    why_not: str | None = None  # nothing can be done: readable
    costs: dict[str, float] = field(default_factory=dict)  # victim -> its reload cost


def decayed_uses(uses: float, last_used: float | None, now: float,
                 half_life_s: float = USE_HALF_LIFE_S) -> float:
    """A use count as of ``now``, each use weighing half as much every ``half_life_s``."""
    if last_used is None or uses <= 0:
        return 0.0
    return uses * 0.5 ** (max(0.0, now - last_used) / half_life_s)


def reload_cost(c: Idle) -> float:
    """Expected seconds of loading that stopping ``c`` will cost later."""
    return c.load_s * (1.0 + c.uses)


def not_evictable(c: Idle, short: Mapping[str, float], protect: frozenset[str]) -> str | None:
    """Why ``c`` may never be evicted for this shortfall, or None."""
    if c.key in protect:
        return "the waiting job reserves it"
    if c.users > 0:
        return "it has users"
    if not c.yieldable:
        return "it is not yieldable"
    if c.lifecycle != "on_demand":
        return f"its lifecycle is {c.lifecycle!r}"
    if c.held:
        return "it is held"
    if not c.ready:
        return "it is not ready (starting or stopping)"
    if not any(c.frees.get(r, 0.0) > 0 for r, need in short.items() if need > 0):
        return "it frees none of what is short"
    return None


def _covers(group: Sequence[Idle], short: Mapping[str, float]) -> bool:
    return all(sum(c.frees.get(r, 0.0) for c in group) + _EPS >= need
               for r, need in short.items() if need > 0)


def _best(pool: Sequence[Idle], short: Mapping[str, float]) -> tuple[Idle, ...] | None:
    if not _covers(pool, short):
        return None
    if len(pool) <= EXHAUSTIVE_MAX:
        best: tuple[Idle, ...] | None = None
        best_key: tuple[float, int, tuple[str, ...]] | None = None
        for n in range(1, len(pool) + 1):
            for group in itertools.combinations(pool, n):
                if not _covers(group, short):
                    continue
                k = (round(sum(reload_cost(c) for c in group), 9), n,
                     tuple(sorted(c.key for c in group)))
                if best_key is None or k < best_key:
                    best, best_key = group, k
        return best
    # Many candidates: cheapest per unit of what is short first, then drop any victim the
    # rest already covers (the dearest first).
    def per_unit(c: Idle) -> tuple[float, str]:
        useful = sum(min(c.frees.get(r, 0.0), need) / need for r, need in short.items()
                     if need > 0)
        return (reload_cost(c) / max(useful, _EPS), c.key)

    chosen: list[Idle] = []
    for c in sorted(pool, key=per_unit):
        chosen.append(c)
        if _covers(chosen, short):
            break
    for c in sorted(chosen, key=lambda c: (-reload_cost(c), c.key)):
        rest = [x for x in chosen if x is not c]
        if rest and _covers(rest, short):
            chosen = rest
    return tuple(chosen)


def choose(short: Mapping[str, float], candidates: Sequence[Idle], *,
           protect: frozenset[str] = frozenset()) -> Plan:
    """The services to stop so that ``short`` (resource -> amount missing) is freed."""
    short = {r: v for r, v in short.items() if v > _EPS}
    if not short:
        return Plan()
    eligible = [c for c in candidates if not_evictable(c, short, protect) is None]
    old = [c for c in eligible if c.ready_for_s >= c.load_s]
    group = _best(old, short)
    if group is not None:
        return Plan(tuple(sorted(c.key for c in group)),
                    costs={c.key: round(reload_cost(c), 3) for c in group})
    young = sorted((c for c in eligible if c.ready_for_s < c.load_s),
                   key=lambda c: (c.load_s - c.ready_for_s, c.key))
    for i in range(len(young)):
        if _covers(old + young[:i + 1], short):
            # Enough once these are as old as their load time: ask again then.
            return Plan(wake_in_s=round(young[i].load_s - young[i].ready_for_s, 3),
                        why_not="the idle services that would make room became ready less "
                                "than their load time ago")
    have = ", ".join(f"{sum(c.frees.get(r, 0.0) for c in eligible):g} of {need:g} {r}"
                     for r, need in sorted(short.items()))
    return Plan(why_not=f"idle services that may be evicted free only {have}")
