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


def phases(t0: float, t_end: float, load_s: float, jobs: list[dict[str, Any]],
           parallel: int) -> dict[str, float]:
    """What a warm run's wall minus one load is made of (seconds, pure), from the job records
    (``started_at``: the runner's spawn, ``finished_at``: the final record) and the bench's
    own clock (``t0`` the first submit, ``t_end`` the last answer; all ``time.time()``):

    - ``service_start``: the first runner's start after the submit, minus the load (the
      service's start op, its daemon's interpreter, the ready signal, the admission);
    - ``runners``: the slot-waves' runner spans (each wave: its longest job, spawn to final
      record), summed over the waves;
    - ``hand_offs``: a slot freed to its next job started, summed over the waves;
    - ``tail``: the last final record to the bench's last answer."""
    starts = sorted(j["started_at"] for j in jobs)
    ends = sorted(j["finished_at"] for j in jobs)
    waves = [sorted(jobs, key=lambda j: j["started_at"])[i:i + parallel]
             for i in range(0, len(jobs), parallel)]
    runners = sum(max(j["finished_at"] - j["started_at"] for j in w) for w in waves)
    hand_offs = sum(max(0.0, starts[i] - ends[i - parallel]) for i in range(parallel, len(starts)))
    return {"service_start": starts[0] - t0 - load_s, "runners": runners,
            "hand_offs": hand_offs, "tail": t_end - ends[-1]}


def _warm_round(b: Bench, r: int, n: int, load_s: float) -> tuple[float, int, dict[str, float]]:
    state = b.tmp / f"warm-{r}"
    module_id = mf.load(MODELSERVER).id
    with Agent(state, [MODELSERVER], {"modelserver": {"load_s": load_s, "slots": PARALLEL}},
               profile=b.profile_path(f"{b.figure}-warm-agent-{r}")) as ag:
        t0, w0 = time.monotonic(), time.time()
        ids = ag.submit("modelserver", "generate", [{"prompts": _prompts(i)} for i in range(n)])
        done = ag.wait_all(ids)
        wall = time.monotonic() - t0
        bad = [j for j in done if j["state"] != "succeeded"]
        if bad:
            raise RuntimeError(f"warm job {bad[0]['job_id']}: {bad[0]['reason']}")
        rows = {j["job_id"]: j for j in ag.status()["jobs"]}
        split = phases(w0, w0 + wall, load_s, [rows[i] for i in ids], PARALLEL)
    return wall, _loads(state / "modules" / module_id / "data" / "model.loads"), split


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
    splits: list[dict[str, float]] = []
    for r in range(p.warm_rounds):
        w, n_loads, split = _warm_round(b, r, p.warm_jobs, p.warm_load_s)
        splits.append(split)
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
                   "parallel": PARALLEL, "rounds": p.warm_rounds, "phases": splits},
        "where": ["wall - load, round by round: " + "; ".join(
            ", ".join(f"{k} {v:.2f} s" for k, v in sp.items()) for sp in splits)]}
