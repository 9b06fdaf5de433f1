"""Figure 1: warm vs per-job load. N jobs of 4 tokens through a real agent and one warm
examples/modelserver service (4 slots), against the same N jobs each loading the model
in-process (the modelserver's own ``load_model``/``complete``), 4 at a time."""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from oarbank_sdk import manifest as mf

from ..agentproc import Agent
from ..config import MODELSERVER, WARM_TOKENS
from ..context import Bench
from ..stats import metric

TITLE = "1. warm vs per-job load"
PARALLEL = 4

# The job without a service: load the model itself, then run its prompts.
IN_PROCESS_JOB = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import model_service as m
m.load_model(Path(sys.argv[2]), float(sys.argv[3]))
texts = [m.complete(p) for p in sys.argv[4:]]
assert len(texts) == len(sys.argv) - 4
"""


def _prompts(i: int) -> list[str]:
    return [f"prompt {t} of job {i}" for t in range(WARM_TOKENS)]


def _loads(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


def _warm_round(b: Bench, r: int, n: int, load_s: float) -> tuple[float, int]:
    state = b.tmp / f"warm-{r}"
    module_id = mf.load(MODELSERVER).id
    with Agent(state, [MODELSERVER], {"modelserver": {"load_s": load_s, "slots": PARALLEL}},
               profile=b.profile_path(f"warm-agent-{r}")) as ag:
        t0 = time.monotonic()
        ag.run_jobs("modelserver", "generate", [{"prompts": _prompts(i)} for i in range(n)])
        wall = time.monotonic() - t0
    return wall, _loads(state / "modules" / module_id / "data" / "model.loads")


def _per_job_round(b: Bench, r: int, n: int, load_s: float) -> tuple[float, int]:
    data = b.tmp / f"perjob-{r}"
    data.mkdir()

    def job(i: int) -> None:
        subprocess.run([sys.executable, "-I", "-c", IN_PROCESS_JOB, str(MODELSERVER), str(data),
                        str(load_s), *_prompts(i)], check=True, stdin=subprocess.DEVNULL)

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as ex:
        list(ex.map(job, range(n)))
    return time.monotonic() - t0, _loads(data / "model.loads")


def run(b: Bench) -> dict[str, Any]:
    p = b.params
    walls, loads, base_walls, base_loads = [], [], [], []
    for r in range(p.warm_rounds):
        w, n_loads = _warm_round(b, r, p.warm_jobs, p.warm_load_s)
        walls.append(w)
        loads.append(float(n_loads))
        w, n_loads = _per_job_round(b, r, p.warm_jobs, p.warm_load_s)
        base_walls.append(w)
        base_loads.append(float(n_loads))
    over = [w - p.warm_load_s for w in walls]
    base = f"{p.warm_jobs} jobs loading in-process, {PARALLEL} at a time"
    return {"title": TITLE, "metrics": {
        "wall": metric(walls, unit="s", baseline=base_walls, baseline_name=base,
                       with_p99=False, targets={"ratio": f"<= {1 / 3.5:.4f}"}),
        "model_loads": metric(loads, unit="loads", baseline=base_loads, baseline_name=base,
                              with_p99=False, targets={"median": "== 1"}),
        "wall_minus_load": metric(over, unit="s", with_p99=False, targets={"median": "<= 0.5"},
                                  note="warm wall time minus one model load"),
    }, "details": {"jobs": p.warm_jobs, "load_s": p.warm_load_s, "tokens": WARM_TOKENS,
                   "parallel": PARALLEL, "rounds": p.warm_rounds}}
