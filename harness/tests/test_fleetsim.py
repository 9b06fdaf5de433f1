"""The fleet bench's simulation (harness/bench/fleetsim.py): its lower bound on loads row by row,
its nodes' room as the agent computes it, and a small fleet run through the portal's placement
code both ways."""

from __future__ import annotations

import pytest

from harness.bench import fleetsim as fs
from oarbank_agent.fleet.offer import ModuleView, NodeView, ServiceView, room


@pytest.mark.parametrize(("work", "span", "load", "slots", "nodes"), [
    (100.0, 110.0, 10.0, 1, 1),  # one node, busy from its load's end to the last done
    (101.0, 110.0, 10.0, 1, 2),  # a second longer than one node can give
    (400.0, 110.0, 10.0, 4, 1),  # four tokens on the node
    (1.0, 1000.0, 10.0, 4, 1),  # at least one
    (4000.0, 60.0, 50.0, 4, 100),  # most of the span goes to the load
])
def test_lower_bound_is_the_fewest_nodes_loading_once(work: float, span: float, load: float,
                                                       slots: int, nodes: int) -> None:
    assert fs.lower_bound({0: work}, {0: span}, {0: load}, slots) == {0: nodes}


def test_lower_bound_refuses_a_span_no_longer_than_the_load() -> None:
    with pytest.raises(ValueError, match="not longer than its load"):
        fs.lower_bound({0: 1.0}, {0: 30.0}, {0: 30.0}, 4)


def _view(sim: fs.Sim, n: fs.Node) -> NodeView:
    """The same node as the agent's claim code reads it (offer.NodeView)."""
    claim, _room = sim.snapshot(n)
    mods = tuple(ModuleView(s.module, ("generate",), (ServiceView(
        "model", s.state, dict(s.pools), s.load_s, s.mem_gb),)) for s in claim.services)
    return NodeView(claim.node_id, mods, claim.free_mem_gb, claim.evictable_mem_gb)


@pytest.mark.parametrize("case", ["empty", "starting", "ready busy", "ready idle",
                                  "waiting for another model"])
def test_a_simulated_node_claims_the_room_the_agent_would(case: str) -> None:
    sim = fs.Sim(fs.SimParams(nodes=1, models=3, jobs=10), "warm-aware")
    n = sim.nodes[0]
    job = sim.jobs[0]
    if case != "empty":
        n.loaded, n.ready_at = 0, 5.0
        sim.now = 1.0 if case == "starting" else 10.0
    if case == "ready busy":
        n.held = [job]
    if case == "waiting for another model":
        n.held = [job]
        n.waiting.append(fs.Job(99, 1, 0.0, 1.0))
    _claim, got = sim.snapshot(n)
    assert got == room(_view(sim, n))
    assert got == {"empty": 12, "starting": 4, "ready busy": 3, "ready idle": 12,
                   "waiting for another model": 3}[case]


def test_a_small_fleet_runs_every_job_once_and_warm_aware_loads_less() -> None:
    p = fs.SimParams(nodes=8, models=3, jobs=400, seed=7)
    aware, blind = fs.simulate(p, "warm-aware"), fs.simulate(p, "warm-blind")
    for r in (aware, blind):
        assert r["grants"] == p.jobs and r["granted_twice"] == 0
    assert aware["loads"] < blind["loads"]
    assert aware["p95_s"] < blind["p95_s"]
    assert set(aware["cold_starts_by_rule"]) <= {"no warm copy", "backlog and arrivals", "overdue"}
