"""Figure 4: readiness latency, from the moment a service has loaded its model (the service
writes the time) to the first runner's start (the runner's first line), both ways a service
becomes ready (contract section 3): ``probe`` says ``ready`` on its channel, ``probe_polled``
says nothing and the agent polls its ``ready`` op.

Each round starts each on-demand service cold (it stops 0.1 s after its job), the order
alternating. The baseline is the floor no agent can beat: a runner process's own start-up
(spawn to first line), measured here the same way."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from ..agentproc import BENCH_MODULE, Agent
from ..context import MODULE_ID, Bench
from ..stats import metric

TITLE = "4. readiness"
MS = 1000.0

# service -> the stage whose job needs it
WAYS = {"probe": "readiness", "probe_polled": "readiness_polled"}


def _loaded(b: Bench, service: str) -> list[float]:
    path = b.module_data() / f"{service}.loaded"
    if not path.exists():
        return []
    return [float(x) for x in path.read_text().split()]


def _startup_floor() -> float:
    t0 = time.time()
    out = subprocess.run([sys.executable, "-I", str(BENCH_MODULE / "bench_runner.py"),
                          "doctor"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["runner_start"] - t0


def _one(b: Bench, agent: Agent, service: str) -> float:
    """One cold start of ``service`` for one job: its load's end to the runner's start."""
    agent.wait_service(service, running=False)
    before = len(_loaded(b, service))
    res = agent.run_jobs(MODULE_ID, WAYS[service], [{}])[0]
    loads = _loaded(b, service)
    if len(loads) != before + 1:
        raise RuntimeError(f"expected one new {service} load, found {len(loads) - before}")
    return float(res["runner_start"] - loads[-1])


def run(b: Bench) -> dict[str, Any]:
    p = b.params
    agent = b.agent()
    lat: dict[str, list[float]] = {s: [] for s in WAYS}
    floor: list[float] = []
    for r in range(p.ready_rounds):
        for service in (list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]):
            lat[service].append(_one(b, agent, service))
        floor.append(_startup_floor())
    for service in WAYS:
        agent.wait_service(service, running=False)
    base = "runner start-up alone (spawn to first line)"
    return {"title": TITLE, "metrics": {
        "readiness_latency_ready_message": metric(
            lat["probe"], unit="ms", scale=MS, baseline=floor, baseline_name=base,
            targets={"ratio": "<= 1.1"},  # issue 29 (issue 16's was median <= 10 ms)
            note="the service says ready on its channel (OARBANK_ENDPOINT_FEATURES=ready)"),
        "readiness_latency_polled": metric(
            lat["probe_polled"], unit="ms", scale=MS, baseline=floor, baseline_name=base,
            targets={"ratio": "<= 2.0"},  # issue 29 (issue 16's was median <= 40 ms)
            note="the agent polls the service's ready op"),
    }, "details": {"load_s": p.ready_load_s}}
