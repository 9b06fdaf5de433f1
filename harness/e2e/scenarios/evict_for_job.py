"""evict-for-job: a node's memory budget is a warm cache. Two modules (examples/modelserver
twice, under two ids), each service reserving 0.5 GB of a 0.8 GB budget, idle_timeout_s 600 as
the example ships. A job of the first runs and its service goes idle; a job of the second does
not wait out those 600 s: the agent stops the idle service (`evicted`, naming the job) and the
job starts within that stop + its own service's load + 1 s.

The stop and the load are read from the agent's log (its state changes, each with its time:
differences only, so the node's clock and time zone do not matter); the job's wait from its
record (submitted_at to started_at, the agent's clock)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from harness.e2e.scenario import Ctx, ScenarioFailed, scenario
from harness.e2e.scenarios.common import wait_portal, wait_row
from harness.modelcopy import modelserver_as
from harness.nodes.backends.base import Node

MODS = ("dev.oarbank.e2e.model-a", "dev.oarbank.e2e.model-b")
LOAD_S = 1.0  # each model's load (the example's load_s setting)
RESERVE_GB = 0.5  # each service's fingerprint reserve.mem_gb (the example's model_gb)
BUDGET_GB = 0.8  # room for one of them
IDLE_TIMEOUT_S = 600  # the example's own: what the second job waited before eviction
SLACK_S = 1.0  # the bound: stop + load + 1 s
WAIT_S = 60.0  # how long the scenario waits for the second job at most

# "2026-12-07 04:44:46,411 oarbank_agent.services.supervisor INFO <module>/<service>: ready ->
# stopping (stop): evicted" (the agent's logging format; the first line of a log_tail may carry
# a backend's prefix, so no ^ anchor)
_CHANGE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \w+ (\S+)/(\S+): "
                     r"(\w+) -> (\w+) \((\w+)\)")


def state_changes(log: str) -> list[tuple[float, str, str, str]]:
    """(seconds on the log's clock, module, from state, to state) of each service state
    change the agent logged, in order."""
    out = []
    for m in _CHANGE.finditer(log):
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append((t, m.group(2), m.group(4), m.group(5)))
    return out


def _last(changes: list[tuple[float, str, str, str]], module: str, old: str, new: str,
          what: str) -> float:
    found = [t for t, m, a, b in changes if m == module and a == old and b == new]
    if not found:
        raise AssertionError(f"the agent's log has no {module} change {old} -> {new} ({what}); "
                             f"changes logged: {[(m, a, b) for _, m, a, b in changes]}")
    return found[-1]


def _loads(node: Node, module: str) -> int:
    return sum(len([ln for ln in f.read_text(errors="replace").splitlines() if ln.strip()])
               for f in node.find_files("model.loads") if f.parent.parent.name == module)


@scenario("evict-for-job", "two models, a budget for one: the second model's job does not wait "
          "out the idle first's idle_timeout_s (600 s): it is evicted, naming the job, and the "
          "job starts within its stop + the load + 1 s", needs_portal=True)
def evict_for_job(ctx: Ctx) -> None:
    a, b = MODS
    src = [modelserver_as(ctx.folder / "src" / m.rsplit(".", 1)[1], m) for m in MODS]
    node = ctx.node("evict-a", list(src), flags=("--memory-budget-gb", f"{BUDGET_GB:g}"),
                    settings={m: {"model_gb": RESERVE_GB, "load_s": LOAD_S} for m in MODS})
    ctx.note(f"{a} and {b}: examples/modelserver, idle_timeout_s {IDLE_TIMEOUT_S}, each "
             f"reserving {RESERVE_GB:g} GB of a {BUDGET_GB:g} GB budget")

    first = node.submit(a, "generate", {"prompts": ["first"]}, wait=True)
    ctx.check(first["state"] == "succeeded", f"the job of {a}: {first}")
    # Idle, and past the no-thrash window (a service ready for less than its own load time is
    # not evicted): ready for longer than its start-to-ready in the agent's log.
    changes = state_changes(node.log_tail(10**7))
    a_load = (_last(changes, a, "starting", "ready", "its first load")
              - _last(changes, a, "stopped", "starting", "its first start"))
    idle = wait_row(ctx, node, a, "model", f"ready, no users, up for over {a_load:.2f} s",
                    lambda r: r["ready"] and r["users"] == 0
                    and (r.get("uptime_s") or 0) > a_load + 0.2, 30)
    ctx.check((idle.get("idle_stop_in_s") or 0) > IDLE_TIMEOUT_S - 60,
              f"{a} should be far from its idle stop: {idle}")
    ctx.note(f"{a} idle: up {idle['uptime_s']} s (its load took {a_load:.2f} s), idle stop in "
             f"{idle['idle_stop_in_s']} s")

    job = node.submit(b, "generate", {"prompts": ["second"]})["job_id"]
    try:
        rec = ctx.wait_jobs(node, [job], WAIT_S)[job]
    except ScenarioFailed as exc:
        raise ScenarioFailed(f"the job of {b} did not start within {WAIT_S:g} s (where {a}, idle, "
                             f"was {IDLE_TIMEOUT_S} s from its idle stop): {exc}; {a}'s row: "
                             f"{node.service_row(a, 'model')}") from None
    ctx.check(rec["state"] == "succeeded", f"the job of {b}: {rec}")
    wait_s = float(rec["started_at"]) - float(rec["submitted_at"])
    changes = state_changes(node.log_tail(10**7))
    evict_t = _last(changes, a, "ready", "stopping", "the eviction")
    start_t = _last(changes, b, "stopped", "starting", "the start for the job")
    ready_t = _last(changes, b, "starting", "ready", "the load for the job")
    stop_s, load_s = start_t - evict_t, ready_t - start_t
    ctx.note(f"the job of {b} waited {wait_s:.2f} s: {a} stopping to {b} starting {stop_s:.2f} s, "
             f"{b}'s load {load_s:.2f} s (bound: {stop_s + load_s + SLACK_S:.2f} s)")
    ctx.check(wait_s <= stop_s + load_s + SLACK_S,
              f"the job of {b} waited {wait_s:.2f} s: over {a}'s stop {stop_s:.2f} s + its load "
              f"{load_s:.2f} s + {SLACK_S:g} s")

    row = node.service_row(a, "model") or {}
    want = f"job {job} of module {b}"
    ctx.check(not row.get("running") and row.get("last_stop_reason") == "evicted"
              and row.get("evicted_for") == want,
              f"{a}'s row should say evicted for {want}: {row}")
    ctx.note(f"status: {a} last_stop_reason={row['last_stop_reason']} "
             f"evicted_for={row['evicted_for']!r}")
    table = node.cli("status", "--state-dir", node.host_to_node(node.state_dir)).stdout
    line = f"EVICTED {a}/model: to make room for {want}"
    ctx.check(line in table, f"status's table lacks {line!r}:\n{table[-1500:]}")
    ctx.note(f"status table: {line}")
    gone = [str(p) for p in node.processes()
            if "model_service.py" in p.cmdline and "model-a" in p.cmdline]
    ctx.check(not gone, f"processes of the evicted service survive: {gone}")
    ctx.check((_loads(node, a), _loads(node, b)) == (1, 1),
              f"model.loads: {a} {_loads(node, a)}, {b} {_loads(node, b)} (want 1 each)")
    ctx.note("the evicted service's processes are gone; each model loaded once")
    pr: dict[str, Any] = wait_portal(ctx, a, node, "model", "stopped, why stopped evicted",
                                     lambda r: r.get("state") == "stopped"
                                     and r.get("stopped_reason") == "evicted")
    ctx.note(f"portal's services query: {a} state={pr['state']} "
             f"stopped_reason={pr['stopped_reason']}")
