"""``--multi-model``: one node, a memory budget for one model, three modules (examples/modelserver
under three ids) alternating, one job at a time. Total job wait with demand eviction against the
node without it, side by side in one run, and model loads against their lower bound.

- **Eviction**: the services as the example ships them (``idle_timeout_s`` 600, yieldable): a job
  of the next module makes the agent stop the idle one (``evicted``).
- **Baseline** (the node before demand eviction): the same jobs, the services declared
  ``yieldable = false``, which demand eviction never stops, so each job of the next module
  waits until the idle one's idle timeout stops it. Run with ``idle_timeout_s`` cut to
  ``baseline_idle_s`` (a few seconds) to keep the run short; its total wait is then carried to
  600 s by adding ``600 - baseline_idle_s`` for each job that waited out an idle timeout
  (``extrapolate``: a job's wait there is the idle timeout less the gap from the last job's
  end to its submit, then the stop and the load; only the timeout changes with it).

A job's wait is its record's ``started_at - submitted_at`` (the agent's clock). Every job must
succeed with one attempt and no release (a service with users is never evicted).
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.modelcopy import modelserver_as

from .agentproc import Agent

__all__ = ["MultiParams", "MULTI_FULL", "MULTI_QUICK", "sequence", "lower_bound", "extrapolate",
           "run_multi_model", "summary", "write"]

MODULES = tuple(f"dev.oarbank.bench.model-{c}" for c in "abc")
RESERVE_GB = 0.5  # each service's reserve.mem_gb (the example's model_gb)
BUDGET_GB = 0.8  # --memory-budget-gb: room for one model
IDLE_TIMEOUT_S = 600.0  # the example's idle_timeout_s: what the figures are for
TARGET_RATIO = 0.05


@dataclass(frozen=True)
class MultiParams:
    jobs: int
    load_s: float  # each model's load (the example's load_s setting)
    baseline_idle_s: float  # the baseline run's idle_timeout_s (extrapolated to 600 s)


MULTI_FULL = MultiParams(jobs=60, load_s=1.0, baseline_idle_s=3.0)
MULTI_QUICK = MultiParams(jobs=12, load_s=0.5, baseline_idle_s=2.0)


def sequence(jobs: int, modules: tuple[str, ...] = MODULES) -> list[str]:
    """Which module each job is of: the modules in turn."""
    return [modules[i % len(modules)] for i in range(jobs)]


def lower_bound(seq: list[str]) -> int:
    """The fewest model loads a budget for one model allows: one, plus one per module switch."""
    return (1 if seq else 0) + sum(1 for x, y in zip(seq, seq[1:], strict=False) if x != y)


def extrapolate(waits: list[float], switched: list[bool], idle_s: float,
                to_idle_s: float = IDLE_TIMEOUT_S) -> float:
    """The baseline's total wait had ``idle_timeout_s`` been ``to_idle_s``: each job that
    waited out an idle timeout (``switched``) waits ``to_idle_s - idle_s`` longer."""
    if len(waits) != len(switched):
        raise ValueError(f"{len(waits)} waits for {len(switched)} jobs")
    return sum(waits) + sum(to_idle_s - idle_s for s in switched if s)


def _loads(state: Path, module: str) -> int:
    f = state / "modules" / module / "data" / "model.loads"
    return len(f.read_text().split()) if f.exists() else 0


def _one_run(tmp: Path, name: str, seq: list[str], p: MultiParams, *, baseline: bool
             ) -> dict[str, Any]:
    """One agent, the jobs of ``seq`` one after the other; waits, loads, evictions."""
    idle_s = p.baseline_idle_s if baseline else IDLE_TIMEOUT_S
    mods = [modelserver_as(tmp / f"{name}-src" / m.rsplit(".", 1)[1], m,
                           idle_timeout_s=idle_s, **({"yieldable": False} if baseline else {}))
            for m in MODULES]
    state = tmp / name
    settings = {m: {"model_gb": RESERVE_GB, "load_s": p.load_s} for m in MODULES}
    with Agent(state, mods, settings, extra_args=["--memory-budget-gb", f"{BUDGET_GB:g}"]) as ag:
        for i, m in enumerate(seq):
            [job] = ag.submit(m, "generate", [{"prompts": [f"job {i}"]}])
            rec = ag.wait(job, timeout=120.0 + (idle_s if baseline else 0.0))
            if rec["state"] != "succeeded":
                raise RuntimeError(f"{name}: job {i} of {m} {rec['state']}: {rec.get('reason')} "
                                   f"(see {state}/jobs/{job})")
        rows = {j["job_id"]: j for j in ag.status()["jobs"]}
        log = ag.log_path.read_text(errors="replace")
    records = sorted(rows.values(), key=lambda j: j["submitted_at"])
    bad = [j for j in records if j["attempts"] != 1 or j.get("released")]
    if bad:  # a service with users was stopped under a job
        raise RuntimeError(f"{name}: job {bad[0]['job_id']} took {bad[0]['attempts']} attempts, "
                           f"{bad[0].get('released')} released")
    waits = [j["started_at"] - j["submitted_at"] for j in records]
    switched = [i > 0 and seq[i] != seq[i - 1] for i in range(len(seq))]
    # The baseline's extrapolation holds where a job waited out the idle timeout: submitted
    # before it ran out (the gap since the last job's end under baseline_idle_s).
    gaps = [records[i]["submitted_at"] - records[i - 1]["finished_at"] if i else 0.0
            for i in range(len(records))]
    return {
        "idle_timeout_s": idle_s, "yieldable": not baseline,
        "total_wait_s": round(sum(waits), 3),
        "median_switch_wait_s": round(statistics.median(
            w for w, s in zip(waits, switched, strict=True) if s), 3) if any(switched) else None,
        "max_gap_s": round(max(gaps), 3),
        "waits_s": [round(w, 3) for w in waits], "switched": switched,
        "loads": {m: _loads(state, m) for m in MODULES},
        "evictions": len(re.findall(r": evicting it \(", log)),
    }


def run_multi_model(quick: bool, keep: bool = False) -> dict[str, Any]:
    p = MULTI_QUICK if quick else MULTI_FULL
    seq = sequence(p.jobs)
    tmp = Path(tempfile.mkdtemp(prefix="oarbank-bench-mm-"))
    t0 = time.time()
    try:
        print(f"bench --multi-model: {p.jobs} jobs with demand eviction ...", file=sys.stderr,
              flush=True)
        ev = _one_run(tmp, "evict", seq, p, baseline=False)
        print(f"bench --multi-model: the same {p.jobs} jobs without it (idle_timeout_s "
              f"{p.baseline_idle_s:g}) ...", file=sys.stderr, flush=True)
        base = _one_run(tmp, "base", seq, p, baseline=True)
    except BaseException:
        print(f"bench --multi-model: logs and state kept in {tmp}", file=sys.stderr)
        raise
    if keep:
        print(f"bench --multi-model: logs and state kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    base_600 = extrapolate([float(w) for w in base["waits_s"]], base["switched"],
                           p.baseline_idle_s)
    valid = base["max_gap_s"] < p.baseline_idle_s
    ratio = ev["total_wait_s"] / base_600 if base_600 > 0 else None
    return {"params": asdict(p), "modules": list(MODULES), "budget_gb": BUDGET_GB,
            "reserve_gb": RESERVE_GB, "lower_bound_loads": lower_bound(seq),
            "eviction": ev, "baseline": base,
            "baseline_total_wait_at_600_s": round(base_600, 1),
            "baseline_extrapolation_holds": valid,
            "ratio": ratio, "target": f"<= {TARGET_RATIO:g}",
            "ok": ratio is not None and ratio <= TARGET_RATIO and valid,
            "seconds": round(time.time() - t0, 1)}


def summary(r: dict[str, Any]) -> str:
    ev, base, p = r["eviction"], r["baseline"], r["params"]
    n = p["jobs"]
    lines = [
        f"{n} jobs, {len(r['modules'])} modules in turn, one at a time; each model reserves "
        f"{r['reserve_gb']:g} GB of a {r['budget_gb']:g} GB budget; load_s {p['load_s']:g}",
        f"total job wait with demand eviction (idle_timeout_s {ev['idle_timeout_s']:g}): "
        f"{ev['total_wait_s']:.2f} s (a switch's median {ev['median_switch_wait_s']} s; "
        f"{ev['evictions']} evictions)",
        f"total job wait without it: {base['total_wait_s']:.2f} s measured at idle_timeout_s "
        f"{base['idle_timeout_s']:g} (a switch's median {base['median_switch_wait_s']} s), "
        f"{r['baseline_total_wait_at_600_s']:.1f} s at 600 s (+{600 - base['idle_timeout_s']:g} "
        f"s for each of {sum(base['switched'])} switches)"
        + ("" if r["baseline_extrapolation_holds"] else
           f" NOT VALID: a job came {base['max_gap_s']} s after the last, past the timeout"),
        f"ratio {r['ratio']:.4f} (target {r['target']}): {'met' if r['ok'] else 'MISSED'}",
        f"model loads: with eviction {sum(ev['loads'].values())} {ev['loads']}, without "
        f"{sum(base['loads'].values())}; lower bound {r['lower_bound_loads']} (1 + the module "
        f"switches)",
    ]
    return "\n".join(lines)


def write(out: Path, r: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(r, indent=2) + "\n")
    tmp.replace(out)
