"""``--fleet``, part (c): real nodes. A real portal (SQLite) and 4 real agents on this machine
(``run --claim``), 3 modules (examples/modelserver under three ids, ``harness/modelcopy.py``)
whose stand-in models load in 3 s and each fill a node's memory budget (0.5 GB of 0.8 GB:
a node switches models by demand eviction), 240 jobs of 0.2 s (``hold_s``) in mixed order,
submitted to the portal as one batch. Twice in the same run, each time with a fresh portal
and fresh agents: ``serve --placement warm-aware`` and ``warm-blind`` (first come, first
served). Figures: model loads (each service's ``model.loads``, one line a load), the
makespan (the batch's submit to its last job's end, the portal's clock) and the median
submit-to-done (a job's ``finished_at - submitted_at`` at the portal), and each ratio
warm-aware / warm-blind (targets: loads <= 1/3, makespan <= 0.6, median <= 0.5).
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness.modelcopy import modelserver_as

from .agentproc import Agent
from .portal import PortalProcess

__all__ = ["NodesParams", "NODES_FULL", "NODES_QUICK", "batch_jobs", "call", "issue_token",
           "run_real_nodes", "token_file"]

MODULES = tuple(f"dev.oarbank.bench.fleet-{c}" for c in "abc")
RESERVE_GB = 0.5
BUDGET_GB = 0.8  # room for one model
LOAD_S = 3.0
HOLD_S = 0.2


class NodesParams:
    def __init__(self, nodes: int, jobs: int) -> None:
        self.nodes, self.jobs = nodes, jobs


NODES_FULL = NodesParams(nodes=4, jobs=240)
NODES_QUICK = NodesParams(nodes=4, jobs=60)


def call(url: str, method: str, path: str, token: str, doc: Any = None,
         timeout: float = 60.0) -> Any:
    """One JSON call to the portal at ``url`` with ``token``; its answer's document."""
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - loopback
        return json.loads(r.read())


def batch_jobs(url: str, token: str, batch: str) -> list[dict[str, Any]]:
    """Every job record of ``batch``, page by page."""
    jobs: list[dict[str, Any]] = []
    after: str | None = None
    while True:
        q = f"/v1/jobs?batch={batch}&limit=1000" + (f"&after={after}" if after else "")
        page = call(url, "GET", q, token)
        jobs += page
        if len(page) < 1000:
            return jobs
        after = page[-1]["job_id"]


def token_file(path: Path, token: str) -> Path:
    """``token`` in a file only its owner reads (what ``--portal-token-file`` takes)."""
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return path


def issue_token(db: str, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "token", "issue", *args,
                        "--db", db], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"token issue {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout.strip().splitlines()[-1].strip()


def _loads(state: Path) -> dict[str, int]:
    out = {}
    for m in MODULES:
        f = state / "modules" / m / "data" / "model.loads"
        out[m] = len(f.read_text().split()) if f.exists() else 0
    return out


def _one_run(tmp: Path, mode: str, mods: list[Path], order: list[str],
             p: NodesParams) -> dict[str, Any]:
    folder = tmp / mode
    folder.mkdir()
    db = str(folder / "portal.db")
    serve = ["--placement", mode, "--lease-s", "60"]
    for m in mods:
        serve += ["--module", str(m)]
    # tokens before the portal starts (its migrations run on open; the CLI opens the same db)
    sub = issue_token(db, "--submitter", "bench")
    tokens = {f"node-{i}": issue_token(db, f"node-{i}") for i in range(p.nodes)}
    portal = PortalProcess(db, folder, 1, tuple(serve))
    agents: list[Agent] = []
    try:
        url = f"http://{portal.host}:{portal.port}"
        settings = {m: {"model_gb": RESERVE_GB, "load_s": LOAD_S} for m in MODULES}
        for node, token in tokens.items():
            tf = token_file(folder / f"{node}.token", token)
            agents.append(Agent(folder / node, mods, settings, extra_args=[
                "--node-id", node, "--portal", url, "--portal-token-file", str(tf),
                "--claim", "--claim-wait-s", "2", "--memory-budget-gb", f"{BUDGET_GB:g}"]))
        print(f"bench fleet nodes [{mode}]: {p.nodes} agents up; {len(order)} jobs ...",
              file=sys.stderr, flush=True)
        batch = call(url, "POST", "/v1/jobs", sub, {"jobs": [
            {"module": m, "stage": "generate",
             "payload": {"prompts": [f"job {i}"], "hold_s": HOLD_S}}
            for i, m in enumerate(order)]})["batch_id"]
        deadline = time.monotonic() + 600
        while True:
            counts = call(url, "GET", f"/v1/batches/{batch}", sub)
            st = counts["states"]
            if st["queued"] == 0 and st["running"] == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{mode}: jobs not done after 600 s: {st}")
            time.sleep(0.5)
        jobs = batch_jobs(url, sub, batch)
    finally:
        for a in agents:
            a.stop()
        portal.stop()
    loads = {a.state_dir.name: _loads(a.state_dir) for a in agents}
    bad = [j for j in jobs if j["state"] != "succeeded"]
    if bad:
        raise RuntimeError(f"{mode}: {len(bad)} jobs not succeeded, e.g. {bad[0]['job_id']} "
                           f"{bad[0]['state']} (logs in {folder})")
    s2d = [j["finished_at"] - j["submitted_at"] for j in jobs]
    per_node: dict[str, dict[str, int]] = {}
    for j in jobs:
        d = per_node.setdefault(j["node_id"], {})
        d[j["placement"]] = d.get(j["placement"], 0) + 1
    return {"mode": mode, "loads": sum(sum(x.values()) for x in loads.values()),
            "loads_by_node": loads, "placements_by_node": per_node,
            "makespan_s": round(max(j["finished_at"] for j in jobs)
                                - min(j["submitted_at"] for j in jobs), 2),
            "median_s": round(statistics.median(s2d), 2),
            "grants": sum(j["grants"] for j in jobs), "jobs": len(jobs)}


def run_real_nodes(quick: bool, keep: bool = False) -> dict[str, Any]:
    p = NODES_QUICK if quick else NODES_FULL
    rnd = random.Random(50)
    order = [MODULES[i % len(MODULES)] for i in range(p.jobs)]
    rnd.shuffle(order)  # mixed order
    tmp = Path(tempfile.mkdtemp(prefix="ob-fleet-"))
    try:
        mods = [modelserver_as(tmp / "src" / m.rsplit(".", 1)[1], m) for m in MODULES]
        runs = {mode: _one_run(tmp, mode, mods, order, p)
                for mode in ("warm-aware", "warm-blind")}
    except BaseException:
        print(f"bench fleet nodes: logs and state kept in {tmp}", file=sys.stderr)
        raise
    if keep:
        print(f"bench fleet nodes: logs and state kept in {tmp}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    a, b = runs["warm-aware"], runs["warm-blind"]

    def ratio(k: str) -> float | None:
        return round(a[k] / b[k], 3) if b[k] else None

    return {"nodes": p.nodes, "jobs": p.jobs, "modules": list(MODULES), "load_s": LOAD_S,
            "hold_s": HOLD_S, "budget_gb": BUDGET_GB, "reserve_gb": RESERVE_GB,
            "warm_aware": a, "warm_blind": b,
            "ratios": {"loads": ratio("loads"), "makespan": ratio("makespan_s"),
                       "median": ratio("median_s")},
            "targets": {"loads": "<= 0.333", "makespan": "<= 0.6", "median": "<= 0.5"}}
