"""Placement (contract 10.5) row by row: the pure decision a claim gets, no store, no clock."""

from __future__ import annotations

import pytest

from oarbank_ui.dispatch.placement import Candidate, Node, Pick, cold_allowed, decide

M, N = "dev.example.a", "dev.example.b"


def cand(module: str = M, state: str = "ready", slots: int = 4, backlog: int = 10,
         wait: float = 1.0, **kw: object) -> Candidate:
    kw.setdefault("service", "model")
    return Candidate(module, kw.pop("stage", "generate"), state, slots, backlog, wait,  # type: ignore[arg-type]
                     **kw)  # type: ignore[arg-type]


# (why, node, candidates, expected picks as (module, count, placement))
ROWS = [
    ("ready with free tokens: as many as the tokens",
     Node(8), [cand(slots=3)], [(M, 3, "ready")]),
    ("never more than the backlog", Node(8), [cand(slots=4, backlog=2)], [(M, 2, "ready")]),
    ("never more than max_grants", Node(2), [cand(slots=4)], [(M, 2, "ready")]),
    ("ready before starting, whatever waited longer",
     Node(3), [cand(N, "starting", slots=4, wait=30), cand(M, "ready", slots=2, wait=1)],
     [(M, 2, "ready"), (N, 1, "starting")]),
    ("starting when nothing is ready", Node(8), [cand(state="starting", slots=2)],
     [(M, 2, "starting")]),
    ("a trickle stays put: 1 job x 1 s over 4 warm tokens elsewhere < a 30 s load",
     Node(8), [cand(state="stopped", backlog=1, warm_tokens=4, load_s=30, job_s=1)], []),
    ("a burst spreads: 200 jobs x 1 s over 4 warm tokens = 50 s > a 30 s load",
     Node(8), [cand(state="stopped", backlog=200, warm_tokens=4, load_s=30, job_s=1)],
     [(M, 4, "cold")]),
    ("no warm copy anywhere: a cold start whatever the backlog",
     Node(8), [cand(state="stopped", backlog=1, warm_tokens=0, load_s=300)], [(M, 1, "cold")]),
    ("unknown times count as 1 s jobs and 60 s loads: 100 / 2 = 50 s < 60 s",
     Node(8), [cand(state="stopped", backlog=100, warm_tokens=2)], []),
    ("unknown times: 130 / 2 = 65 s > 60 s", Node(8),
     [cand(state="stopped", backlog=130, warm_tokens=2)], [(M, 4, "cold")]),
    ("a cold copy whose memory does not fit is not started",
     Node(8, free_mem_gb=2, evictable_mem_gb=1), [cand(state="stopped", mem_gb=4)], []),
    ("... it fits with what the agent would evict",
     Node(8, free_mem_gb=2, evictable_mem_gb=3), [cand(state="stopped", mem_gb=4)],
     [(M, 4, "cold")]),
    ("one cold start per claim: the longest-waiting", Node(8),
     [cand(M, "stopped", wait=5), cand(N, "stopped", wait=9)], [(N, 4, "cold")]),
    ("no free token: nothing", Node(8), [cand(slots=0)], []),
    ("a stage without a pool takes max_grants", Node(5),
     [cand(state="none", slots=0, service=None)], [(M, 5, "ready")]),
    ("two ready modules share max_grants a job at a time, the longest-waiting first",
     Node(5), [cand(M, slots=4, wait=2), cand(N, slots=4, wait=3)],
     [(N, 3, "ready"), (M, 2, "ready")]),
    ("no starving: B's job waited past 60 s: first, even on a stopped service",
     Node(2), [cand(M, "ready", slots=4, wait=10), cand(N, "stopped", backlog=1, wait=61,
                                                         warm_tokens=8, load_s=30)],
     [(N, 1, "cold"), (M, 1, "ready")]),
    ("unknown on this node: the fleet's job time counts: 100 x 20 s / 2 = 1,000 s > 60 s",
     Node(8), [cand(state="stopped", backlog=100, warm_tokens=2, fleet_job_s=20)],
     [(M, 4, "cold")]),
    ("unknown load here: the fleet's: 100 x 1 s / 2 = 50 s > a 40 s load measured elsewhere",
     Node(8), [cand(state="stopped", backlog=100, warm_tokens=2, fleet_load_s=40)],
     [(M, 4, "cold")]),
    ("... the node's own load first: 50 s < its 90 s", Node(8),
     [cand(state="stopped", backlog=100, warm_tokens=2, load_s=90, fleet_load_s=40)], []),
    ("the warm copies keep up with the arrivals: no cold copy for a standing backlog: 150 x "
     "10 s / 40 = 37.5 s > 30 s, but 150 jobs over 50 s is 3/s, x 10 s = 30 tokens, and 40 "
     "warm > 30 x 1.25",
     Node(8), [cand(state="stopped", backlog=150, wait=50, warm_tokens=40, load_s=30,
                    job_s=10)], []),
    ("... they fall short: 300 jobs over 50 s is 6/s x 10 s = 60 tokens > 40 warm",
     Node(8), [cand(state="stopped", backlog=300, wait=50, warm_tokens=40, load_s=30,
                    job_s=10)], [(M, 4, "cold")]),
    ("... the node's own measure first: 100 x 1 s / 2 = 50 s < 60 s",
     Node(8), [cand(state="stopped", backlog=100, warm_tokens=2, job_s=1, fleet_job_s=20)],
     []),
    ("overdue and a copy already starting elsewhere: no second cold copy",
     Node(2), [cand(M, "ready", slots=4, wait=10), cand(N, "stopped", backlog=1, wait=61,
                                                         warm_tokens=4, starting_tokens=4,
                                                         load_s=30)],
     [(M, 2, "ready")]),
    ("... unless the backlog calls for it: 100 x 10 s / 4 = 250 s > 30 s",
     Node(2), [cand(M, "ready", slots=4, wait=10), cand(N, "stopped", backlog=100, wait=61,
                                                         warm_tokens=4, starting_tokens=4,
                                                         load_s=30, fleet_job_s=10)],
     [(N, 2, "cold")]),
    ("... but a load longer than 60 s is waited for first",
     Node(2), [cand(M, "ready", slots=4, wait=10), cand(N, "stopped", backlog=1, wait=61,
                                                         warm_tokens=8, load_s=90)],
     [(M, 2, "ready")]),
    ("stages of one service share its tokens", Node(8),
     [cand(stage="a", slots=3, wait=2), cand(stage="b", slots=3, wait=1)],
     [("a", 2, "ready"), ("b", 1, "ready")]),
]


@pytest.mark.parametrize("why,node,cands,expected", ROWS, ids=[r[0] for r in ROWS])
def test_warm_aware(why: str, node: Node, cands: list[Candidate],
                    expected: list[tuple[str, int, str]]) -> None:
    got = decide(node, cands)
    if any(e[0] in ("a", "b") for e in expected):
        assert sorted((p.stage, p.count, p.placement) for p in got) == sorted(expected), why
    else:
        assert sorted((p.module, p.count, p.placement) for p in got) == sorted(expected), why


BLIND = [
    ("first come, first served: the longest-waiting stage first, whatever is warm", Node(6),
     [cand(M, "ready", wait=1), cand(N, "stopped", wait=5, warm_tokens=100)],
     [(N, 4, "cold"), (M, 2, "ready")]),
    ("blind to the backlog's cost: a trickle still starts a cold copy", Node(8),
     [cand(state="stopped", backlog=1, warm_tokens=4, load_s=30, job_s=1)], [(M, 1, "cold")]),
]


@pytest.mark.parametrize("why,node,cands,expected", BLIND, ids=[r[0] for r in BLIND])
def test_warm_blind(why: str, node: Node, cands: list[Candidate],
                    expected: list[tuple[str, int, str]]) -> None:
    got = decide(node, cands, mode="warm-blind")
    assert sorted((p.module, p.count, p.placement) for p in got) == sorted(expected), why


def test_cold_allowed_is_the_formula() -> None:
    # backlog x job_s / warm_tokens > load_s, exactly at the edge
    edge = cand(state="stopped", backlog=120, warm_tokens=4, load_s=30, job_s=1)
    assert not cold_allowed(edge, Node(8))  # 120 / 4 = 30: not longer than a load
    assert cold_allowed(cand(state="stopped", backlog=121, warm_tokens=4, load_s=30, job_s=1),
                        Node(8))
    # warm_tokens < backlog / max(wait, 1 s) x job_s x 1.25, exactly at the edge: 40 jobs
    # over 10 s x 10 s = 40 tokens, x 1.25 = 50 (and 40 x 10 / 50 = 8 s > a 5 s load)
    at = cand(state="stopped", backlog=40, wait=10, warm_tokens=50, load_s=5, job_s=10)
    assert not cold_allowed(at, Node(8))
    assert cold_allowed(cand(state="stopped", backlog=40, wait=10, warm_tokens=49, load_s=5,
                             job_s=10), Node(8))
    # a wait under a second counts as one: 40 jobs just in, x 10 s = 400 x 1.25 = 500 tokens
    assert cold_allowed(cand(state="stopped", backlog=40, wait=0.01, warm_tokens=49,
                             load_s=5, job_s=10), Node(8))


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="warm-aware, warm-blind"):
        decide(Node(1), [], mode="random")


def test_picks_are_picks() -> None:
    assert decide(Node(1), [cand()]) == [Pick(M, "generate", 1, "ready")]


# -- fencing (contract 10.6, 10.7): whether a node's word about an attempt still counts ---------

from oarbank_ui.dispatch.leases import Attempt, fence  # noqa: E402

FENCE = [
    ("live and the node's", Attempt("n1", 1, "running", 100.0, 1), "n1", 1, 99.0, None),
    ("its lease ran out, the job not granted again", Attempt("n1", 1, "running", 100.0, 1),
     "n1", 1, 101.0, "lease_lost"),
    ("expired, not granted again", Attempt("n1", 1, "expired", 100.0, 1), "n1", 1, 99.0,
     "lease_lost"),
    ("expired and granted again since", Attempt("n1", 1, "expired", 100.0, 2), "n1", 1, 99.0,
     "stale_generation"),
    ("released and granted again", Attempt("n1", 1, "released", 100.0, 2), "n1", 1, 99.0,
     "stale_generation"),
    ("another node's attempt", Attempt("n2", 1, "running", 100.0, 1), "n1", 1, 99.0,
     "not_your_attempt"),
    ("no such attempt", None, "n1", 1, 99.0, "not_your_attempt"),
    ("a generation the attempt is not", Attempt("n1", 2, "running", 100.0, 2), "n1", 1, 99.0,
     "stale_generation"),
    ("cancelled", Attempt("n1", 1, "cancelled", 100.0, 1), "n1", 1, 99.0, "cancelled"),
    ("already ended with a result: a replay", Attempt("n1", 1, "succeeded", 100.0, 1), "n1",
     1, 200.0, "done"),
]


@pytest.mark.parametrize("why,attempt,node,generation,now,expected", FENCE,
                         ids=[r[0] for r in FENCE])
def test_fence(why: str, attempt: Attempt | None, node: str, generation: int, now: float,
               expected: str | None) -> None:
    assert fence(attempt, node, generation, now) == expected, why


# -- when a claim needs the fleet's view (offers.needs_fleet) --------------------------------

from oarbank_ui.dispatch.catalogue import Catalogue, ModuleInfo  # noqa: E402
from oarbank_ui.dispatch.offers import Warmth, candidates, needs_fleet  # noqa: E402
from oarbank_ui.dispatch.protocol import Claim, ServiceOffer  # noqa: E402

CAT = Catalogue([ModuleInfo("m.a", {"gen": {"model": 1}, "prep": {}}, {"model": "svc"}),
                 ModuleInfo("m.b", {"gen": {"model": 1}}, {"model": "svc"})])


def _claim(*services: tuple[str, str, float | None], free: int = 2) -> Claim:
    return Claim("n1", 0, 4, 8.0, 0.0, {m: list(CAT.modules[m].stages) for m, _s, _l in services},
                 [ServiceOffer(m, "svc", state, {"model": (free, 4)}, load, 0.5, 1.0)
                  for m, state, load in services])


@pytest.mark.parametrize("why,claim,modules,expected", [
    ("every service ready or starting and measured: the node's own word is enough",
     _claim(("m.a", "ready", 30.0), ("m.b", "starting", 40.0)), ["m.a", "m.b"], False),
    ("a stopped service weighs a cold start against the other nodes' copies",
     _claim(("m.a", "ready", 30.0), ("m.b", "stopped", 40.0)), ["m.a", "m.b"], True),
    ("a load time the node does not know is the fleet's mean",
     _claim(("m.a", "ready", None)), ["m.a"], True),
    ("only the modules with queued jobs count",
     _claim(("m.a", "ready", 30.0), ("m.b", "stopped", None)), ["m.a"], False),
])
def test_needs_fleet(why: str, claim: Claim, modules: list[str], expected: bool) -> None:
    assert needs_fleet(claim, modules) is expected, why


@pytest.mark.parametrize("seed", range(200))
def test_a_claim_that_does_not_need_the_fleet_is_placed_the_same_without_it(seed: int) -> None:
    """What ``needs_fleet`` lets the store skip changes no decision: for random queues, fleet
    views and warm, measured claims, placement with the fleet's view and without it agree."""
    import random

    rnd = random.Random(seed)
    states = ["ready", "starting"]
    claim = _claim(*[(m, rnd.choice(states), rnd.uniform(1, 120)) for m in ("m.a", "m.b")],
                   free=rnd.randint(0, 4))
    queue = {(m, st): (rnd.randint(1, 500), rnd.choice([0.0, 5.0, 59.0, 61.0, 200.0]))
             for m in ("m.a", "m.b") for st in CAT.modules[m].stages if rnd.random() < 0.8}
    modules = sorted({m for m, _ in queue})
    assert not needs_fleet(claim, modules)
    warm = {(m, "svc"): Warmth(rnd.randint(0, 40), rnd.randint(0, 8), rnd.uniform(0.1, 5),
                               rnd.uniform(1, 120)) for m in modules}
    cold = {k: rnd.randint(0, 3) for k in queue}
    node = Node(claim.max_grants, claim.free_mem_gb, claim.evictable_mem_gb)
    with_fleet = decide(node, candidates(claim, CAT, queue, warm, cold), starve_s=60.0)
    without = decide(node, candidates(claim, CAT, queue, {}, {}), starve_s=60.0)
    assert with_fleet == without
