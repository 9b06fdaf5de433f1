"""Demand eviction's decision (protection/eviction.py), row by row, and the lifecycle's side
of it (an idle service asked to make room stops with reason ``evicted``)."""

from __future__ import annotations

from typing import Any

import pytest

from oarbank_agent.jobs.admission import Admission, Request
from oarbank_agent.protection.eviction import Idle, choose, decayed_uses, reload_cost
from oarbank_agent.services import lifecycle as lc


def idle(key: str, gb: float = 0.5, *, load_s: float = 1.0, ready_for_s: float = 100.0,
         uses: float = 0.0, gpu: float = 0.0, **kw: Any) -> Idle:
    frees = {"mem_gb": gb} if gb else {}
    if gpu:
        frees["gpu_mem_gb"] = gpu
    return Idle(key, frees, load_s=load_s, ready_for_s=ready_for_s, uses=uses, **kw)


MEM = {"mem_gb": 0.5}

# (what is short, the services, the waiting job's own services, victims, wake_in_s)
ROWS = [
    # the scenario of issue 46: one idle model, the other module's job short of 0.2 GB
    ("one idle service frees enough", {"mem_gb": 0.2}, [idle("a/m")], (), ("a/m",), None),
    ("nothing is short: nothing stopped", {"mem_gb": 0.0}, [idle("a/m")], (), (), None),
    ("a service with users is never evicted", MEM, [idle("a/m", users=1)], (), (), None),
    ("a non-yieldable service is never evicted", MEM, [idle("a/m", yieldable=False)], (), (),
     None),
    ("an always (pinned) service is never evicted", MEM, [idle("a/m", lifecycle="always")], (),
     (), None),
    ("a manual service is never evicted", MEM, [idle("a/m", lifecycle="manual")], (), (),
     None),
    ("a held service is not ours to stop", MEM, [idle("a/m", held=True)], (), (), None),
    ("one starting or stopping is not evicted", MEM, [idle("a/m", ready=False)], (), (), None),
    ("the waiting job's own service is kept", MEM, [idle("b/m")], ("b/m",), (), None),
    ("not enough to free: nothing stopped", {"mem_gb": 1.2}, [idle("a/m"), idle("c/m")], (),
     (), None),
    ("the cheaper reload goes: shorter load", MEM,
     [idle("a/m", load_s=5.0), idle("c/m", load_s=1.0)], (), ("c/m",), None),
    ("the cheaper reload goes: used less (decayed count)", MEM,
     [idle("a/m", uses=3.0), idle("c/m", uses=0.5)], (), ("c/m",), None),
    ("two small beat one big when they cost less", {"mem_gb": 0.8},
     [idle("a/big", 1.0, load_s=10.0), idle("c/s1", 0.4), idle("d/s2", 0.4)], (),
     ("c/s1", "d/s2"), None),
    ("one big beats two small when it costs less", {"mem_gb": 0.8},
     [idle("a/big", 1.0, load_s=1.5), idle("c/s1", 0.4), idle("d/s2", 0.4)], (), ("a/big",),
     None),
    ("no more than needed", {"mem_gb": 0.3}, [idle("a/m"), idle("c/m")], (), ("a/m",), None),
    ("no thrash: younger than its load time waits until it is not", MEM,
     [idle("a/m", load_s=2.0, ready_for_s=0.5)], (), (), 1.5),
    ("an old one is taken over a young one", MEM,
     [idle("a/m", load_s=2.0, ready_for_s=0.5), idle("c/m", load_s=3.0)], (), ("c/m",), None),
    ("GPU memory short: only a service holding GPU memory helps", {"gpu_mem_gb": 4.0},
     [idle("a/cpu", 4.0), idle("c/gpu", 0.5, gpu=6.0)], (), ("c/gpu",), None),
    ("both short: the set must cover both", {"mem_gb": 1.0, "gpu_mem_gb": 4.0},
     [idle("a/cpu", 1.0), idle("c/gpu", 0.2, gpu=6.0), idle("d/both", 1.0, gpu=4.0,
                                                             load_s=1.5)],
     (), ("d/both",), None),
]


@pytest.mark.parametrize(("case", "short", "services", "protect", "victims", "wake"), ROWS,
                         ids=[r[0] for r in ROWS])
def test_choose(case: str, short: dict[str, float], services: list[Idle],
                protect: tuple[str, ...], victims: tuple[str, ...],
                wake: float | None) -> None:
    plan = choose(short, services, protect=frozenset(protect))
    assert plan.victims == victims, case
    assert plan.wake_in_s == wake, case
    if not victims and any(v > 0 for v in short.values()):
        assert plan.why_not, case


def test_many_candidates_take_the_greedy_path_and_still_cover() -> None:
    services = [idle(f"m{i}/s", 0.1, load_s=1.0 + i / 10) for i in range(20)]
    plan = choose({"mem_gb": 0.35}, services)
    assert plan.victims == ("m0/s", "m1/s", "m2/s", "m3/s")


def test_reload_cost_weighs_load_by_recent_use() -> None:
    assert reload_cost(idle("a/m", load_s=2.0)) == 2.0
    assert reload_cost(idle("a/m", load_s=2.0, uses=1.0)) == 4.0
    assert decayed_uses(4.0, 1000.0, 1600.0, half_life_s=600.0) == 2.0
    assert decayed_uses(4.0, None, 1600.0) == 0.0


def test_admission_says_which_job_memory_holds_back() -> None:
    a = Admission()
    a.budget_gb = 0.8
    a.service_charges = {"a/m": 0.5}  # an idle service of another module
    a.enqueue(Request("jb", services_mem={"b/m": 0.5}))
    a.enqueue(Request("jc", services_mem={"c/m": 0.5}))
    assert a.admit() == []
    block = a.memory_blocked
    assert block is not None and block.job_id == "jb"
    assert block.short == {"mem_gb": pytest.approx(0.2)} and block.reserves == {"b/m"}
    a.note("jb", "making room: stopping idle a/m")
    assert a.why_waiting("jb") == ("waiting for memory: needs 0.5 GB; 0.5 of 0.8 GB budget "
                                   "charged; making room: stopping idle a/m")
    a.service_charges = {}
    assert [r.job_id for r in a.admit()] == ["jb"] and a.memory_blocked is not None
    assert a.memory_blocked.job_id == "jc"  # (jb's service is charged now)


def test_a_job_short_of_tokens_too_is_not_made_room_for() -> None:
    a = Admission()
    a.budget_gb = 0.8
    a.service_charges = {"a/m": 0.5}
    a.set_capacity("b/pool", 0)
    a.enqueue(Request("jb", pools={"b/pool": 1}, services_mem={"b/m": 0.5}))
    assert a.admit() == [] and a.memory_blocked is None


def _ready(users: int = 0, lifecycle: str = "on_demand") -> lc.ServiceState:
    s = lc.ServiceState(lifecycle, 600.0, 1.0, 60.0, 5, users=users)
    s = lc.apply(lc.apply(s, lc.Event.START, 0.0), lc.Event.READY, 1.0)
    return lc.set_users(s, users, 1.0)


def test_the_lifecycle_stops_an_idle_service_asked_to_make_room() -> None:
    s = lc.set_evict(_ready(), "job j1 of module b")
    assert lc.decide(s, 2.0) == lc.Decision("stop", reason=lc.EVICTED)
    stopping = lc.apply(s, lc.Event.STOP, 2.0, reason=lc.EVICTED)
    assert stopping.stopped_reason == "evicted" and stopping.stopped_for == "job j1 of module b"
    stopped = lc.apply(stopping, lc.Event.STOPPED, 3.0)
    assert stopped.stopped_for == "job j1 of module b" and stopped.evict_for is None
    assert lc.apply(stopped, lc.Event.START, 4.0).stopped_for is None
    # a user first: no eviction; a pinned service: never
    assert lc.decide(lc.set_users(s, 1, 2.0), 2.0) == lc.Decision()
    assert lc.decide(lc.set_evict(_ready(lifecycle="always"), "x"), 2.0) == lc.Decision()


def test_gpu_memory_is_a_budget_too() -> None:
    """No GPU here: the GPUs' memory given as a number, as NVML's total would be."""
    a = Admission()
    a.gpu_budget_gb = 8.0
    a.service_gpu_charges = {"a/llm": 6.0}  # an idle LLM holds 6 of 8 GB
    a.enqueue(Request("jb", services_gpu={"b/reranker": 4.0}))
    a.enqueue(Request("jc"))  # charges nothing: goes ahead
    assert [r.job_id for r in a.admit()] == ["jc"]
    assert a.why_waiting("jb") == "waiting for GPU memory: needs 4 GB; 6 of 8 GB charged"
    block = a.memory_blocked
    assert block is not None and block.short == {"gpu_mem_gb": 2.0}
    assert block.reserves == {"b/reranker"}
    # host memory fits (no budget), so only a service holding GPU memory helps
    plan = choose(block.short, [idle("a/cpu", 4.0), idle("a/llm", 0.0, gpu=6.0)],
                  protect=block.reserves)
    assert plan.victims == ("a/llm",)
    a.service_gpu_charges = {}
    assert [r.job_id for r in a.admit()] == ["jb"]
    assert a.service_gpu_charges == {"b/reranker": 4.0}


def test_both_budgets_short_at_once() -> None:
    a = Admission()
    a.budget_gb, a.gpu_budget_gb = 1.0, 8.0
    a.service_charges, a.service_gpu_charges = {"a/llm": 0.8}, {"a/llm": 6.0}
    a.enqueue(Request("jb", services_mem={"b/m": 0.5}, services_gpu={"b/m": 4.0}))
    assert a.admit() == []
    assert a.why_waiting("jb") == ("waiting for memory: needs 0.5 GB; 0.8 of 1 GB budget "
                                   "charged; waiting for GPU memory: needs 4 GB; 6 of 8 GB "
                                   "charged")
    assert a.memory_blocked is not None
    assert a.memory_blocked.short == {"mem_gb": pytest.approx(0.3), "gpu_mem_gb": 2.0}
