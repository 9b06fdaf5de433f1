"""Which queued jobs a claiming node gets: pure decision code (no I/O, no clock), contract 10.5.

The store hands ``decide`` one ``Candidate`` per stage the node offers that has jobs queued:
what the node can take of it now (its service's state and free tokens), how much waits
(backlog, the oldest job's wait) and how warm the rest of the fleet is for it. ``decide``
answers how many jobs of each stage to grant, and why (``ready``, ``starting``, ``cold``); the
store then takes that many of the oldest queued jobs of each stage.

Warm-aware (the default), in steps:
1. a stage whose oldest job waited past ``starve_s`` (or its load time, if longer) goes first,
   whatever its service's state: jobs of one module never starve behind another's; on a
   stopped service only when no copy is starting elsewhere or the backlog rule (4) holds, so
   every idle node claiming while the stage is overdue does not start a copy of its own;
2. ready services with free tokens (and stages that need no service);
3. starting services;
4. a cold copy, only when the work waiting for the warm copies takes longer than a load
   (``backlog x job_s / warm_tokens > load_s``), the warm copies fall short of the arrivals
   (``warm_tokens < rate x job_s x (1 + HEADROOM)``, ``rate`` = backlog / the oldest job's
   wait: Little's law on a first-in first-out queue) and its memory fits; one per claim.
   ``job_s`` is the node's measured job time, else the fleet's (``fleet_job_s``: what other
   nodes measured), else ``DEFAULT_JOB_S``; ``load_s`` likewise, else ``DEFAULT_LOAD_S``.
   The backlog rule alone overshoots: copies take a load to start, the backlog grows the
   while, and each claim then sees more work waiting per warm token than the copies starting
   will leave (the simulated fleet: every node loaded, 1.6x the fewest loads); the arrival
   rule stops the starts once the copies warm and starting keep up, and the backlog drains by
   the headroom.
Within a step, stages take turns a job at a time, the longest-waiting first.

Warm-blind (first come, first served, upstream's behaviour): the longest-waiting stages first,
each as many as the node's tokens allow, whatever their services' state.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_JOB_S", "DEFAULT_LOAD_S", "HEADROOM", "MODES", "Candidate", "Node", "Pick",
           "cold_allowed", "decide"]

MODES = ("warm-aware", "warm-blind")
DEFAULT_JOB_S = 1.0  # a stage never measured on any node: a job counts as a second
DEFAULT_LOAD_S = 60.0  # a service never loaded anywhere: a load counts as a minute
HEADROOM = 0.25  # warm tokens beyond the arrivals' need before no more cold copies start
MIN_WAIT_S = 1.0  # the oldest job's wait counts at least this in the arrival rate
STATES = ("ready", "starting", "stopped", "none")  # none: the stage reserves no pool


@dataclass(frozen=True)
class Candidate:
    """One stage the node offers, with jobs queued."""

    module: str
    stage: str
    state: str  # the service providing the stage's pool on this node: STATES
    slots: int  # jobs of this stage the node can take now (its free tokens; none: any)
    backlog: int  # jobs queued (counted up to a cap: enough to decide)
    oldest_wait_s: float  # how long the oldest queued job has waited
    warm_tokens: int = 0  # the service's tokens on other nodes where it is ready or starting
    starting_tokens: int = 0  # of those, the tokens of copies still starting (or granted cold)
    load_s: float | None = None  # measured load time of the service on this node
    job_s: float | None = None  # measured run time of the stage's jobs on this node
    fleet_job_s: float | None = None  # ... on the other nodes that measured it
    fleet_load_s: float | None = None  # measured load time of the service on the other nodes
    mem_gb: float | None = None  # memory the service's start reserves
    service: str | None = None  # stages sharing one service share its slots

    @property
    def budget_key(self) -> tuple[str, str]:
        return (self.module, self.service if self.service is not None else "#" + self.stage)


@dataclass(frozen=True)
class Node:
    max_grants: int
    free_mem_gb: float | None = None  # None: unknown (no memory check)
    evictable_mem_gb: float | None = None


@dataclass(frozen=True)
class Pick:
    module: str
    stage: str
    count: int
    placement: str  # ready | starting | cold


def _load_s(c: Candidate) -> float:
    for v in (c.load_s, c.fleet_load_s):
        if v is not None and v > 0:
            return v
    return DEFAULT_LOAD_S


def _job_s(c: Candidate) -> float:
    for v in (c.job_s, c.fleet_job_s):
        if v is not None and v > 0:
            return v
    return DEFAULT_JOB_S


def _placement(c: Candidate) -> str:
    return {"stopped": "cold", "none": "ready"}.get(c.state, c.state)


def _mem_fits(c: Candidate, node: Node) -> bool:
    if c.mem_gb is None or node.free_mem_gb is None:
        return True
    return c.mem_gb <= node.free_mem_gb + (node.evictable_mem_gb or 0.0)


def cold_allowed(c: Candidate, node: Node) -> bool:
    """A stopped service may start here: the wait for the warm copies is longer than a load,
    and they fall short of the arrivals (no warm copy anywhere: always), and its memory
    fits."""
    if not _mem_fits(c, node):
        return False
    if c.warm_tokens <= 0:
        return True
    job_s = _job_s(c)
    backlog_wait = c.backlog * job_s / c.warm_tokens > _load_s(c)
    rate = c.backlog / max(c.oldest_wait_s, MIN_WAIT_S)
    short_of_arrivals = c.warm_tokens < rate * job_s * (1 + HEADROOM)
    return backlog_wait and short_of_arrivals


def _overdue_cold(c: Candidate, node: Node) -> bool:
    """An overdue stage's stopped service may start here: a copy starting elsewhere will
    serve it within a load, so a second one only where the backlog rule holds too."""
    return _mem_fits(c, node) and (c.starting_tokens <= 0 or cold_allowed(c, node))


def _overdue(c: Candidate, starve_s: float) -> bool:
    return c.oldest_wait_s > max(starve_s, _load_s(c))


def decide(node: Node, candidates: list[Candidate], *, mode: str = "warm-aware",
           starve_s: float = 60.0) -> list[Pick]:
    """The grants for one claim: how many jobs of which stage, and why. At most
    ``node.max_grants`` in all, never more of a stage than its backlog, never more on one
    service than its free tokens."""
    if mode not in MODES:
        raise ValueError(f"placement mode must be one of {', '.join(MODES)}, got {mode!r}")
    budgets: dict[tuple[str, str], int] = {}
    for c in candidates:
        slots = node.max_grants if c.state == "none" else max(0, c.slots)
        budgets[c.budget_key] = min(budgets.get(c.budget_key, slots), slots)
    live = [c for c in candidates if c.backlog > 0 and budgets[c.budget_key] > 0]
    left = [max(0, node.max_grants)]
    counts: dict[tuple[str, str], tuple[int, str]] = {}  # (module, stage) -> count, placement

    def given(c: Candidate) -> int:
        return counts.get((c.module, c.stage), (0, ""))[0]

    def give(c: Candidate, n: int) -> int:
        n = min(n, budgets[c.budget_key], left[0], c.backlog - given(c))
        if n <= 0:
            return 0
        budgets[c.budget_key] -= n
        left[0] -= n
        counts[(c.module, c.stage)] = (given(c) + n, _placement(c))
        return n

    def take_turns(step: list[Candidate]) -> None:
        while left[0] > 0 and any([give(c, 1) for c in step]):
            pass

    by_wait = sorted(live, key=lambda c: (-c.oldest_wait_s, c.module, c.stage))
    if mode == "warm-blind":
        for c in by_wait:
            give(c, c.backlog)
        return _picks(counts)
    overdue = [c for c in by_wait if _overdue(c, starve_s)]
    # an overdue stopped service is a cold start: at most one per claim, only if it fits and
    # no copy is starting already (unless the backlog calls for another)
    overdue_cold = [c for c in overdue if c.state == "stopped" and _overdue_cold(c, node)][:1]
    take_turns([c for c in overdue if c.state != "stopped"] + overdue_cold)
    take_turns([c for c in by_wait if c.state in ("ready", "none")])
    take_turns([c for c in by_wait if c.state == "starting"])
    if not any(c.state == "stopped" and given(c) for c in by_wait):
        take_turns([c for c in by_wait if c.state == "stopped" and cold_allowed(c, node)][:1])
    return _picks(counts)


def _picks(counts: dict[tuple[str, str], tuple[int, str]]) -> list[Pick]:
    return [Pick(m, s, n, why) for (m, s), (n, why) in counts.items() if n > 0]
