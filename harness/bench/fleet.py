"""``nox -s bench -- --fleet``: fleet dispatch (issue 50), four parts side by side in one run:
(a) a simulated fleet on the portal's own placement code (``fleetsim.py``), (b) claim
throughput against a real portal on SQLite and PostgreSQL (``fleetload.py``), (c) real agents
claiming from a real portal, warm-aware against warm-blind (``fleetnodes.py``), (d) faults
under real agents and a real portal on both stores: an agent and the portal killed with -9,
PostgreSQL restarted (``fleetfaults.py``). ``--quick`` runs each smaller; ``--fleet-parts``
picks some."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .stats import check_target

__all__ = ["PARTS", "run_fleet", "table", "write"]

PARTS = ("sim", "claims", "nodes", "faults")


def run_fleet(quick: bool, parts: tuple[str, ...], keep: bool = False,
              stores: tuple[str, ...] = ("sqlite", "postgresql")) -> dict[str, Any]:
    out: dict[str, Any] = {"quick": quick, "started_at": time.time(), "cpus": os.cpu_count(),
                           "load_average_at_start": os.getloadavg()}
    for part in parts:
        t0 = time.monotonic()
        print(f"bench --fleet: {part} ...", file=sys.stderr, flush=True)
        try:
            if part == "sim":
                from .fleetsim import run_fleet_sim

                out[part] = run_fleet_sim(quick)
            elif part == "claims":
                from .fleetload import run_claim_bench

                out[part] = (run_claim_bench(nodes=200, jobs=15_000, window_s=4, stores=stores)
                             if quick else run_claim_bench(stores=stores))
            elif part == "nodes":
                from .fleetnodes import run_real_nodes

                out[part] = run_real_nodes(quick, keep)
            else:
                from .fleetfaults import run_fleet_faults

                out[part] = run_fleet_faults(quick, stores, keep)
        except Exception as exc:  # noqa: BLE001 - reported in the table, the next part runs
            traceback.print_exc()
            out[part] = {"error": f"{type(exc).__name__}: {exc}"}
        out[part]["seconds"] = round(time.monotonic() - t0, 1)
    out["load_average_at_end"] = os.getloadavg()
    out["seconds"] = round(time.time() - out["started_at"], 1)
    return out


def _ok(value: Any, target: str) -> str:
    ok = check_target(value if isinstance(value, (int, float)) else None, target)
    return "-" if ok is None else ("met" if ok else "MISSED")


def _claim_rows(head: str, runs: dict[str, Any]) -> list[str]:
    """One store's claim runs at the fleet's demand: results carried by claims (what the
    agent does) beside results posted alone (the baseline), with their ratio; then what the
    portal gives when the nodes ask more (``capacity``)."""
    if "error" in runs:
        return [f"| {head} | error | {runs['error']} | | | | |"]
    a, b, c = runs.get("carried", {}), runs.get("alone", {}), runs.get("capacity", {})
    for name, run in (("carried", a), ("alone", b), ("capacity", c)):
        if "error" in run or not run:
            return [f"| {head} | error ({name}) | {run.get('error', 'not run')} | | | | |"]

    def pair(key: str) -> str:
        ratio = round(a[key] / b[key], 3) if b[key] else "-"
        return f"{a[key]} | {b[key]} | {ratio}"

    cpu = " / ".join(f"{a['cpu_ms_per_grant'][k]} vs {b['cpu_ms_per_grant'][k]}"
                     for k in ("portal", "database_server", "nodes_client"))
    twice = sum(r[k] for r in (a, b, c) for k in ("granted_twice", "attempts_beyond_one"))
    return [
        f"| {head} | grants/s (asked: {a['asked_grants_per_s']}) | {pair('grants_per_s')} | "
        f">= 1000 | {_ok(a['grants_per_s'], '>= 1000')} |",
        f"| | claim p99 (ms) | {pair('claim_p99_ms')} | <= 100 | "
        f"{_ok(a['claim_p99_ms'], '<= 100')} |",
        f"| | claim p50 (ms) | {pair('claim_p50_ms')} | | |",
        f"| | claim p99 of each 2 s (ms), carried | {a['claim_p99_ms_per_2s']} | | | | |",
        f"| | claims/s (with grants) | {pair('claims_per_s')} | | |",
        f"| | CPU ms per grant and its result, carried vs alone: portal / database server / "
        f"nodes' client | {cpu} | | | | |",
        f"| | capacity (asked {c['asked_grants_per_s']}/s, carried): grants/s, claim p50 / p99"
        f" (ms) | {c['grants_per_s']} | {c['claim_p50_ms']} / {c['claim_p99_ms']} | | | |",
        f"| | jobs granted twice, all three runs (client / store) | "
        f"{sum(r['granted_twice'] for r in (a, b, c))} / "
        f"{sum(r['attempts_beyond_one'] for r in (a, b, c))} | | | 0 | {_ok(twice, '== 0')} |",
    ]


def table(r: dict[str, Any]) -> str:
    rows = ["| part | figure | warm-aware | warm-blind (or baseline) | ratio | target | |",
            "|---|---|---|---|---|---|---|"]
    sim = r.get("sim")
    if sim and "error" not in sim:
        a, b, p = sim["warm_aware"], sim["warm_blind"], sim["params"]
        head = f"sim ({p['nodes']} nodes, {p['models']} models, {p['jobs']} jobs)"
        rows += [
            f"| {head} | model loads (lower bound {sim['lower_bound_loads']}) | {a['loads']} | "
            f"{b['loads']} | {sim['loads_over_bound']} x the bound (blind "
            f"{sim['blind_loads_over_bound']}) | <= 1.5 | "
            f"{_ok(sim['loads_over_bound'], '<= 1.5')} |",
            f"| | p95 submit-to-done (s) | {a['p95_s']} | {b['p95_s']} | {sim['p95_ratio']} | "
            f"<= 0.5 | {_ok(sim['p95_ratio'], '<= 0.5')} |",
            f"| | p50 submit-to-done (s) | {a['p50_s']} | {b['p50_s']} | "
            f"{round(a['p50_s'] / b['p50_s'], 3) if b['p50_s'] else '-'} | | |",
            f"| | makespan (s; last submit {a['last_submit_s']}) | {a['makespan_s']} | "
            f"{b['makespan_s']} | | | |",
            f"| | cold starts by the rule that allowed them | {a['cold_starts_by_rule']} | | "
            "| | |",
            f"| | jobs granted twice | {a['granted_twice']} | {b['granted_twice']} | | 0 | |",
            f"| | simulation wall time (s) | {a['wall_s']} | {b['wall_s']} | | | |",
        ]
    elif sim:
        rows.append(f"| sim | error | {sim['error']} | | | | |")
    claims = r.get("claims")
    if claims and "stores" in claims:
        for kind, runs in claims["stores"].items():
            workers = claims.get("portal_workers", {}).get(kind, "?")
            rows += _claim_rows(f"claims, {kind} ({claims['nodes']} nodes, {workers} portal "
                                "process(es); results carried | alone)", runs)
    elif claims:
        rows.append(f"| claims | error | {claims.get('error')} | | | | |")
    nodes = r.get("nodes")
    if nodes and "error" not in nodes:
        a, b, q = nodes["warm_aware"], nodes["warm_blind"], nodes["ratios"]
        head = f"real nodes ({nodes['nodes']} agents, {nodes['jobs']} jobs)"
        rows += [
            f"| {head} | model loads | {a['loads']} | {b['loads']} | {q['loads']} | <= 0.333 | "
            f"{_ok(q['loads'], '<= 0.333')} |",
            f"| | makespan (s) | {a['makespan_s']} | {b['makespan_s']} | {q['makespan']} | "
            f"<= 0.6 | {_ok(q['makespan'], '<= 0.6')} |",
            f"| | median submit-to-done (s) | {a['median_s']} | {b['median_s']} | "
            f"{q['median']} | <= 0.5 | {_ok(q['median'], '<= 0.5')} |",
            f"| | grants (= jobs: {a['jobs']}) | {a['grants']} | {b['grants']} | | | |",
        ]
        for mode, run in (("warm-aware", a), ("warm-blind", b)):
            per = "; ".join(f"{n}: loads {sum(ls.values())}, placed "
                            f"{run['placements_by_node'].get(n, {})}"
                            for n, ls in sorted(run["loads_by_node"].items()))
            rows.append(f"| | per node, {mode} | {per} | | | | |")
    elif nodes:
        rows.append(f"| real nodes | error | {nodes['error']} | | | | |")
    faults = r.get("faults")
    for kind, f in (faults or {}).get("stores", {}).items():
        head = f"faults, {kind} ({faults['nodes']} agents, {faults['jobs']} jobs)"
        if "error" in f:
            rows.append(f"| {head} | error | {f['error']} | | | | |")
            continue
        rows += [
            f"| {head} | jobs lost | {f['jobs_lost']} | | | 0 | "
            f"{_ok(f['jobs_lost'], '== 0')} |",
            f"| | jobs completed twice (results accepted) | {f['jobs_completed_twice']} | | | "
            f"0 | {_ok(f['jobs_completed_twice'], '== 0')} |",
            f"| | results refused as stale (the fences) | {f['results_refused_as_stale']} "
            f"{f['results_refused']} | | | | |",
            f"| | work done twice (services' ledgers), of it for jobs whose attempt was not "
            f"cut short (a lease expired while the killed node was down, a job the stopped one "
            f"handed back) | {f['work_done_twice']}, "
            f"{f.get('work_done_twice_of_no_cut_attempt', '-')} | | | 0 | "
            f"{_ok(f.get('work_done_twice_of_no_cut_attempt', -1), '== 0')} |",
            f"| | lease expiries; grants (jobs: {f['jobs']}) | {f['lease_expiries']}; "
            f"{f['grants']} | | | | |",
            f"| | jobs the stopped agent handed back; lease expiries among them | "
            f"{f.get('handed_back_at_stop', '-')}; "
            f"{f.get('lease_expiries_of_those_handed_back', '-')} | | | | |",
            f"| | jobs still leased to the stopped agent once it exited | "
            f"{f.get('leased_to_the_stopped_agent_after_it_exited', '-')} | | | 0 | "
            f"{_ok(f.get('leased_to_the_stopped_agent_after_it_exited', -1), '== 0')} |",
        ]
    if faults and "error" in faults:
        rows.append(f"| faults | error | {faults['error']} | | | | |")
    return "\n".join(rows)


def write(out: Path, r: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(r, indent=2, default=str) + "\n")
    tmp.replace(out)
