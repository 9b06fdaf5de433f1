"""``--fleet``, part (a): a simulated fleet. The portal's own placement code
(``oarbank_ui.dispatch.offers.candidates`` and ``placement.decide``, imported, no I/O) decides
every claim of 1,000 simulated nodes on a simulated clock (an event simulation), warm-aware and
warm-blind on the same jobs; nodes follow the agent's rules (``oarbank_agent.fleet.offer``,
``jobs/admission.py``, demand eviction).

The fleet: ``nodes`` nodes, each with a memory budget for one model and ``slots`` tokens on
each model's pool; ``models`` models, each with a load time in [30, 120] s and a mean job time
in [10, 30] s (each job 0.5x-1.5x it), Zipf popularity (s = 1); ``jobs`` jobs arriving as a
Poisson stream at ``utilisation`` of the fleet's token capacity, submitted as one batch a
second (a submitter posting what came in the last second).

A node, as the agent behaves:
- claims when it has room (``offer.room``: the free tokens of its loaded service, ready or
  starting, plus those of every stopped model whose memory fits the free memory plus what
  demand eviction could free, i.e. the loaded one when idle), ``max_grants`` that many; its
  claim is a snapshot: changes while it waits reach the portal with the next claim;
- a claim with nothing granted waits (long poll): the portal looks at it again every second
  (the jobs of that second's batch wake it, as ``POLL_S`` would), and after ``wait_s`` the node
  claims afresh; the claims one batch wakes are all answered before any of their nodes claims
  again, so what they were granted (a cold start: a copy starting) reaches the portal's
  picture of the fleet with their next claims, as with concurrent long polls;
- grants become local jobs, admitted first come first served: a job of the loaded model takes a
  free token; a job of another model waits for memory, blocking later jobs of models not
  loaded (jobs of the loaded one go ahead); with one waiting, the loaded service is stopped
  once idle (no job holds a token) and ready for at least its own load time (the no-thrash
  rule), ``STOP_S`` after which the waiting job's model starts loading;
- a model's measured load time and mean job time are known on a node only once it loaded
  or ran it (a claim says null before, and placement reads the fleet's mean job time, as the
  portal does from the other nodes' claims, else its defaults, 60 s and 1 s).

Not modelled: failures and lease expiries (no node fails), the idle timeout (600 s, longer
than most of the run), the portal's own latency (the claim throughput figure, part (b)).

The lower bound on loads (``lower_bound``): for each model, the fewest nodes that could have
served its jobs as fast as the warm-aware run did, each loading it once. A node that starts
loading at the model's first submit at the earliest and whose tokens are all busy from its
load's end to the time the run finished the model's last job serves at most
``slots x (span - load_s)`` job-seconds (``span``: first submit to last done of that model);
so it needs ``ceil(work / (slots x (span - load_s)))`` nodes (``work``: the sum of its jobs'
run times), one at least. The bound is the sum over the models.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from oarbank_ui.dispatch import offers, placement
from oarbank_ui.dispatch.catalogue import Catalogue, ModuleInfo
from oarbank_ui.dispatch.protocol import Claim, ServiceOffer

from .stats import percentile

__all__ = ["SimParams", "SIM_FULL", "SIM_QUICK", "lower_bound", "simulate", "run_fleet_sim"]

STAGE = "generate"
POOL = "model"
MEM_GB = 1.0  # each model's reserve; a node's budget is one model
STOP_S = 1.0  # a service's stop, from eviction to the next model's start
BACKLOG_CAP = 10_000  # the portal's (dispatch/backlog.py): backlog counted up to this
TICK_S = 1.0  # batches of submits, and the long poll's look at the store (POLL_S)


@dataclass(frozen=True)
class SimParams:
    nodes: int
    models: int
    jobs: int
    slots: int = 4  # tokens of a model's pool on a node
    load_s: tuple[float, float] = (30.0, 120.0)
    job_s: tuple[float, float] = (10.0, 30.0)  # models' mean job times
    zipf_s: float = 1.0
    utilisation: float = 0.6  # arrival rate x mean job time / the fleet's tokens
    wait_s: float = 20.0  # the agent's --claim-wait-s
    starve_s: float = 60.0  # the portal's
    seed: int = 50


SIM_FULL = SimParams(nodes=1000, models=20, jobs=100_000)
SIM_QUICK = SimParams(nodes=100, models=10, jobs=10_000)


@dataclass
class Job:
    id: int
    model: int
    submit: float
    dur: float
    granted: float = -1.0
    done: float = -1.0
    node: int = -1
    placement: str = ""


@dataclass
class Node:
    id: int
    loaded: int | None = None  # the model whose service runs (or starts, or stops)
    ready_at: float = 0.0  # when it is (was) ready; > now: starting
    stopping: bool = False
    held: list[Job] = field(default_factory=list)  # admitted: holding a token
    waiting: deque[Job] = field(default_factory=deque)  # granted, not admitted yet
    load_s: dict[int, float] = field(default_factory=dict)  # measured, per model
    job_sum: dict[int, tuple[float, int]] = field(default_factory=dict)
    claim: Claim | None = None  # the long poll waiting at the portal
    claim_no: int = 0
    # the models the waiting claim could get anything of: a free token, and (warm-aware) its
    # memory fits (contract 10.5: a stopped service is started only where its mem_gb fits);
    # only their queues are shown to decide, which gives the others nothing whatever they hold
    takes: set[int] = field(default_factory=set)
    shown: Claim | None = None
    loads: int = 0
    evict_at: float | None = None  # an eviction check is scheduled for this time
    placements: dict[str, int] = field(default_factory=dict)


def _fleet(p: SimParams) -> tuple[list[float], list[float], list[float]]:
    """Per model: load time, mean job time, share of the jobs (Zipf)."""
    rnd = random.Random(p.seed)
    loads = [round(rnd.uniform(*p.load_s), 1) for _ in range(p.models)]
    means = [round(rnd.uniform(*p.job_s), 1) for _ in range(p.models)]
    w = [1.0 / (k + 1) ** p.zipf_s for k in range(p.models)]
    return loads, means, [x / sum(w) for x in w]


def _jobs(p: SimParams, means: list[float], shares: list[float]) -> list[Job]:
    rnd = random.Random(p.seed + 1)
    mean_job = sum(m * s for m, s in zip(means, shares, strict=True))
    rate = p.utilisation * p.nodes * p.slots / mean_job
    t, out = 0.0, []
    models = rnd.choices(range(p.models), weights=shares, k=p.jobs)
    for i, m in enumerate(models):
        t += rnd.expovariate(rate)
        out.append(Job(i, m, math.ceil(t / TICK_S) * TICK_S,  # the batch it is posted in
                       means[m] * rnd.uniform(0.5, 1.5)))
    return out


def lower_bound(work_s: dict[int, float], span_s: dict[int, float], load_s: dict[int, float],
                slots: int) -> dict[int, int]:
    """Per model: the fewest nodes, each loading it once, that could serve ``work_s``
    job-seconds within ``span_s`` (first submit to last done): ``ceil(work / (slots x (span -
    load)))``, at least 1. A span no longer than the load cannot be met by any node: None."""
    out = {}
    for m, work in work_s.items():
        usable = span_s[m] - load_s[m]
        if usable <= 0:
            raise ValueError(f"model {m}: span {span_s[m]:.1f} s is not longer than its load "
                             f"{load_s[m]:.1f} s")
        out[m] = max(1, math.ceil(work / (slots * usable) - 1e-9))
    return out


class Sim:
    def __init__(self, p: SimParams, mode: str) -> None:
        self.p, self.mode = p, mode
        self.load_of, self.mean_of, self.shares = _fleet(p)
        self.jobs = _jobs(p, self.mean_of, self.shares)
        self.mids = [f"sim.model-{m:02d}" for m in range(p.models)]
        self.midx = {m: i for i, m in enumerate(self.mids)}
        self.catalogue = Catalogue([ModuleInfo(m, {STAGE: {POOL: 1}}, {POOL: "model"})
                                    for m in self.mids])
        self.nodes = [Node(i) for i in range(p.nodes)]
        self.queues: list[deque[Job]] = [deque() for _ in range(p.models)]
        self.offer: list[tuple[int, str] | None] = [None] * p.nodes  # latest claim's warmth
        self.warm = [0] * p.models  # nodes whose latest claim says ready or starting
        self.starting = [0] * p.models  # ... of those, starting
        # each node's latest claimed mean job time per model, and their sum and count (the
        # portal's AVG(job_s) over the other nodes' claims)
        self.job_means: list[dict[int, float]] = [{} for _ in range(p.models)]
        self.job_total = [[0.0, 0] for _ in range(p.models)]
        self.load_means: list[dict[int, float]] = [{} for _ in range(p.models)]  # likewise
        # nodes granted a model cold whose claims do not show it starting yet, and when (the
        # store's attempts: the portal counts them as copies starting while they are live)
        self.cold_pending: list[dict[int, float]] = [{} for _ in range(p.models)]
        self.events: list[tuple[float, int, str, int, int]] = []
        self.seq = 0
        self.now = 0.0
        self.waiting_claims: set[int] = set()
        self.rnd = random.Random(p.seed + 2)
        self.decisions = 0
        self.grants = 0
        self.evictions = 0
        self.cold_why: dict[str, int] = {}
        # nodes granted while the portal answers the long polls one batch woke: their
        # offers (what placement reads as warm) change only with their next claim
        self.woken: list[Node] | None = None

    # -- events ------------------------------------------------------------------------------

    def at(self, t: float, kind: str, node: int = -1, arg: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, node, arg))

    def run(self) -> None:
        self.pending = deque(self.jobs)
        for n in self.nodes:  # every node claims at the start (all idle, nothing loaded)
            self.claim(n)
        self.at(0.0, "tick")
        self.done = 0
        while self.events and self.done < len(self.jobs):
            t, _s, kind, nid, arg = heapq.heappop(self.events)
            self.now = t
            if kind == "tick":
                self.tick()
                continue
            n = self.nodes[nid]
            if kind == "done":
                self.finish(n, arg)
            elif kind == "ready":
                self.ready(n)
            elif kind == "stopped":
                self.stopped(n)
            elif kind == "evict":
                n.evict_at = None
                self.admit(n)
            elif kind == "poll_end" and n.claim_no == arg and n.claim is not None:
                self.waiting_claims.discard(nid)
                n.claim = None
                self.claim(n)
        missing = [j.id for j in self.jobs if j.done < 0]
        if missing:
            raise RuntimeError(f"{self.mode}: {len(missing)} jobs never ran (first {missing[0]})")

    def tick(self) -> None:
        """A second's batch is submitted; the waiting long polls look at the store."""
        while self.pending and self.pending[0].submit <= self.now:
            j = self.pending.popleft()
            self.queues[j.model].append(j)
        self.poll()
        if self.pending or any(self.queues):
            self.at(self.now + TICK_S, "tick")

    # -- the node ----------------------------------------------------------------------------

    def ready_now(self, n: Node) -> bool:
        return n.loaded is not None and not n.stopping and n.ready_at <= self.now

    def snapshot(self, n: Node) -> tuple[Claim, int]:
        """The node's claim (offer.claim_body read back as protocol.Claim) and its room."""
        slots = self.p.slots
        per_model = [0] * self.p.models
        for j in n.waiting:
            per_model[j.model] += 1
        charged = MEM_GB if n.loaded is not None else 0.0
        idle = n.loaded is not None and not n.held and self.ready_now(n)
        free_mem, evictable = MEM_GB - charged, (MEM_GB if idle else 0.0)
        services, room = [], 0
        takes: set[int] = set()
        for m, mid in enumerate(self.mids):
            if m == n.loaded and not n.stopping:
                state = "ready" if n.ready_at <= self.now else "starting"
                free = max(0, slots - len(n.held) - per_model[m])
                fits = True
            else:
                state, free = "stopped", max(0, slots - per_model[m])
                fits = free_mem + evictable + 1e-9 >= MEM_GB
            if fits:
                room += free
            if free > 0 and (fits or self.mode == "warm-blind"):
                takes.add(m)
            js = n.job_sum.get(m)
            services.append(ServiceOffer(mid, "model", state, {POOL: (free, slots)},
                                         n.load_s.get(m), js[0] / js[1] if js else None,
                                         MEM_GB))
        claim = Claim(f"n{n.id}", self.p.wait_s, max(1, room), free_mem, evictable,
                      {mid: [STAGE] for mid in self.mids}, services)
        n.takes = takes
        # what decide is shown: the same claim less the services it could get nothing of
        # (offers.candidates reads only the services of stages with jobs shown to it)
        n.shown = Claim(claim.node_id, claim.wait_s, claim.max_grants, free_mem, evictable,
                        claim.stages, [services[m] for m in sorted(takes)])
        return claim, room

    def claim(self, n: Node) -> None:
        if n.claim is not None:
            return
        claim, room = self.snapshot(n)
        if room <= 0:
            return
        n.claim = claim
        n.claim_no += 1
        self.record_offer(n)
        if not self.decide(n):
            self.waiting_claims.add(n.id)
            self.at(self.now + self.p.wait_s, "poll_end", n.id, n.claim_no)

    def record_offer(self, n: Node) -> None:
        assert n.claim is not None
        old = self.offer[n.id]
        new = next(((self.midx[s.module], s.state) for s in n.claim.services
                    if s.state in ("ready", "starting")), None)
        if old is not None:
            self.warm[old[0]] -= 1
            self.starting[old[0]] -= old[1] == "starting"
        if new is not None:
            self.warm[new[0]] += 1
            self.starting[new[0]] += new[1] == "starting"
            self.cold_pending[new[0]].pop(n.id, None)
        self.offer[n.id] = new
        for s in n.claim.services:
            if s.load_s is not None:
                self.load_means[self.midx[s.module]][n.id] = s.load_s
            if s.job_s is not None:
                m = self.midx[s.module]
                old_mean = self.job_means[m].get(n.id)
                tot = self.job_total[m]
                tot[0] += s.job_s - (old_mean or 0.0)
                tot[1] += old_mean is None
                self.job_means[m][n.id] = s.job_s

    def warmth(self, n: Node, m: int, own: tuple[int, str] | None) -> offers.Warmth:
        """Model ``m`` on the other nodes, as the portal's store reads it from their claims."""
        mine = own is not None and own[0] == m
        total, count = self.job_total[m]
        if n.id in self.job_means[m]:
            total, count = total - self.job_means[m][n.id], count - 1
        starting = self.starting[m] - (mine and own is not None and own[1] == "starting")
        pending = self.cold_pending[m]
        for k in [k for k in pending if not self.live_on(self.nodes[k], m)]:
            del pending[k]  # the cold grant's attempts ended: no copy starting there
        fresh = len(pending) - (n.id in pending)  # copies starting that no claim shows yet
        loads = [v for k, v in self.load_means[m].items() if k != n.id]
        return offers.Warmth(self.p.slots * (self.warm[m] - mine + fresh),
                             self.p.slots * (starting + fresh),
                             total / count if count > 0 else None,
                             sum(loads) / len(loads) if loads else None)

    @staticmethod
    def live_on(n: Node, m: int) -> bool:
        """The node still runs (or waits to run) a job of model ``m``: its attempt is live."""
        return any(j.model == m for j in n.held) or any(j.model == m for j in n.waiting)

    def decide(self, n: Node) -> bool:
        """The portal looks at the node's claim: grants, or False (nothing: it waits)."""
        claim = n.shown
        assert n.claim is not None and claim is not None
        now = self.now
        takes = n.takes
        queue = {(self.mids[m], STAGE): (min(len(q), BACKLOG_CAP), now - q[0].submit)
                 for m, q in enumerate(self.queues) if q and m in takes}
        if not queue:
            return False
        own = self.offer[n.id]
        warm = {(self.mids[m], "model"): self.warmth(n, m, own)
                for m, q in enumerate(self.queues) if q and m in takes}
        cands = offers.candidates(claim, self.catalogue, queue, warm)
        picks = placement.decide(placement.Node(claim.max_grants, claim.free_mem_gb,
                                                claim.evictable_mem_gb), cands,
                                 mode=self.mode, starve_s=self.p.starve_s)
        self.decisions += 1
        if not picks:
            return False
        pnode = placement.Node(claim.max_grants, claim.free_mem_gb, claim.evictable_mem_gb)
        for pk in picks:  # why each cold start was allowed (10.5), for the account of loads
            if pk.placement == "cold":
                c = next(c for c in cands if c.module == pk.module)
                why = ("no warm copy" if c.warm_tokens <= 0 else
                       "backlog and arrivals" if placement.cold_allowed(c, pnode)
                       else "overdue")
                self.cold_why[why] = self.cold_why.get(why, 0) + 1
        for pk in picks:
            if pk.placement == "cold":
                self.cold_pending[self.midx[pk.module]][n.id] = now
            q = self.queues[self.midx[pk.module]]
            for _ in range(pk.count):
                j = q.popleft()
                j.granted, j.node, j.placement = now, n.id, pk.placement
                n.waiting.append(j)
                n.placements[pk.placement] = n.placements.get(pk.placement, 0) + 1
                self.grants += 1
        n.claim = None
        self.waiting_claims.discard(n.id)
        self.admit(n)
        if self.woken is None:
            self.claim(n)
        else:  # its next claim comes after the portal answered every claim this batch woke
            self.woken.append(n)
        return True

    def poll(self) -> None:
        """Every waiting long poll looks at the store (the second's batch woke it)."""
        if not self.waiting_claims or not any(self.queues):
            return
        order = sorted(self.waiting_claims)
        self.rnd.shuffle(order)
        self.woken = []
        for nid in order:
            n = self.nodes[nid]
            if n.claim is not None and any(self.queues):
                self.decide(n)
        again, self.woken = self.woken, None
        for n in again:
            self.claim(n)

    def admit(self, n: Node) -> None:
        """The agent's FIFO admission and demand eviction, for one model's memory."""
        mem_blocked = loaded_blocked = False
        for j in list(n.waiting):
            if j.model == n.loaded and not n.stopping:
                if loaded_blocked or len(n.held) >= self.p.slots:
                    loaded_blocked = True
                    continue
                self.start(n, j)
            elif mem_blocked:
                continue
            elif n.loaded is None:
                n.loaded, n.ready_at, n.loads = j.model, self.now + self.load_of[j.model], \
                    n.loads + 1
                self.at(n.ready_at, "ready", n.id)
                self.start(n, j)
            else:
                mem_blocked = True
                self.maybe_evict(n)

    def maybe_evict(self, n: Node) -> None:
        if n.stopping or n.held or n.loaded is None or n.ready_at > self.now:
            return
        not_before = n.ready_at + self.load_of[n.loaded]  # ready for its own load time
        if not_before > self.now + 1e-9:
            if n.evict_at is None:
                n.evict_at = not_before
                self.at(not_before, "evict", n.id)
            return
        n.stopping = True
        self.evictions += 1
        self.at(self.now + STOP_S, "stopped", n.id)

    def stopped(self, n: Node) -> None:
        n.loaded, n.stopping = None, False
        self.admit(n)
        self.changed(n)

    def start(self, n: Node, j: Job) -> None:
        n.waiting.remove(j)
        n.held.append(j)
        if n.ready_at <= self.now:
            self.at(self.now + j.dur, "done", n.id, j.id)

    def ready(self, n: Node) -> None:
        assert n.loaded is not None
        n.load_s[n.loaded] = self.load_of[n.loaded]
        for j in n.held:
            self.at(self.now + j.dur, "done", n.id, j.id)
        self.admit(n)
        self.changed(n)

    def finish(self, n: Node, job_id: int) -> None:
        j = self.jobs[job_id]
        j.done = self.now
        self.done += 1
        n.held.remove(j)
        s, c = n.job_sum.get(j.model, (0.0, 0))
        n.job_sum[j.model] = (s + j.dur, c + 1)
        self.admit(n)
        if not n.held and n.waiting:
            self.maybe_evict(n)
        self.changed(n)

    def changed(self, n: Node) -> None:
        """The node claims when it has room and no claim waits (a waiting claim's picture
        stays what it sent)."""
        self.claim(n)


def simulate(p: SimParams, mode: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    sim = Sim(p, mode)
    sim.run()
    wall = time.perf_counter() - t0
    jobs = sim.jobs
    s2d = [j.done - j.submit for j in jobs]
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    work: dict[int, float] = {}
    for j in jobs:
        first[j.model] = min(first.get(j.model, j.submit), j.submit)
        last[j.model] = max(last.get(j.model, j.done), j.done)
        work[j.model] = work.get(j.model, 0.0) + j.dur
    placements: dict[str, int] = {}
    for n in sim.nodes:
        for k, v in n.placements.items():
            placements[k] = placements.get(k, 0) + v
    return {
        "mode": mode, "loads": sum(n.loads for n in sim.nodes),
        "evictions": sim.evictions,
        "nodes_used": sum(1 for n in sim.nodes if n.loads),
        "p50_s": round(percentile(s2d, 50) or 0.0, 1),
        "p95_s": round(percentile(s2d, 95) or 0.0, 1),
        "p99_s": round(percentile(s2d, 99) or 0.0, 1),
        "makespan_s": round(max(j.done for j in jobs), 1),
        "last_submit_s": round(max(j.submit for j in jobs), 1),
        "grants": sim.grants, "decisions": sim.decisions, "placements": placements,
        "cold_starts_by_rule": sim.cold_why,
        "span_s": {m: last[m] - first[m] for m in first}, "work_s": work,
        "load_s": dict(enumerate(sim.load_of)), "shares": sim.shares,
        "granted_twice": len(jobs) - len({j.id for j in jobs if j.granted >= 0}),
        "wall_s": round(wall, 1),
    }


def run_fleet_sim(quick: bool) -> dict[str, Any]:
    p = SIM_QUICK if quick else SIM_FULL
    aware = simulate(p, "warm-aware")
    blind = simulate(p, "warm-blind")
    bound = lower_bound(aware["work_s"], aware["span_s"], aware["load_s"], p.slots)
    lb = sum(bound.values())
    for r in (aware, blind):  # per-model figures stay in the results only as the bound's
        r.pop("work_s")
        r.pop("span_s")
    return {
        "params": asdict(p), "warm_aware": aware, "warm_blind": blind,
        "lower_bound_loads": lb, "lower_bound_by_model": bound,
        "loads_over_bound": round(aware["loads"] / lb, 2),
        "blind_loads_over_bound": round(blind["loads"] / lb, 2),
        "p95_ratio": round(aware["p95_s"] / blind["p95_s"], 3) if blind["p95_s"] else None,
        "targets": {"loads_over_bound": "<= 1.5", "p95_ratio": "<= 0.5"},
    }
