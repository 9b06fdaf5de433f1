"""Figure 4: readiness latency, from the moment the service has loaded its model (the
``probe`` service writes the time) to the first runner's start (the runner's first line).

Each round starts the on-demand ``probe`` service cold (it stops 0.1 s after its job). The
baseline is the floor no agent can beat: a runner process's own start-up (spawn to first
line), measured here the same way."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from ..agentproc import BENCH_MODULE
from ..context import MODULE_ID, Bench
from ..stats import metric

TITLE = "4. readiness"
MS = 1000.0


def _loaded(b: Bench) -> list[float]:
    path = b.module_data() / "probe.loaded"
    if not path.exists():
        return []
    return [float(x) for x in path.read_text().split()]


def _startup_floor() -> float:
    t0 = time.time()
    out = subprocess.run([sys.executable, "-I", str(BENCH_MODULE / "bench_runner.py"),
                          "doctor"], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["runner_start"] - t0


def run(b: Bench) -> dict[str, Any]:
    p = b.params
    agent = b.agent()
    lat: list[float] = []
    floor: list[float] = []
    for _ in range(p.ready_rounds):
        agent.wait_service("probe", running=False)
        before = len(_loaded(b))
        res = agent.run_jobs(MODULE_ID, "readiness", [{}])[0]
        loads = _loaded(b)
        if len(loads) != before + 1:
            raise RuntimeError(f"expected one new probe load, found {len(loads) - before}")
        lat.append(res["runner_start"] - loads[-1])
        floor.append(_startup_floor())
    agent.wait_service("probe", running=False)
    return {"title": TITLE, "metrics": {
        "readiness_latency": metric(lat, unit="ms", scale=MS, baseline=floor,
                                    baseline_name="runner start-up alone (spawn to first line)",
                                    targets={"median": "<= 100"}),
    }, "details": {"load_s": p.ready_load_s}}
