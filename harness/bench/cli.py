"""The bench's command line: run the figures, print the table, write results.json.

Exit codes: 0 every figure ran (targets missed are reported, not failed: they are goals);
1 a figure could not run (its error is in results.json and the table); 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .config import FULL, QUICK, REPO
from .context import Bench
from .figures import FIGURES
from .report import table, where_time_goes, write_results

__all__ = ["main", "run_bench"]

SCHEMA = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.bench",
                                description="Warm services against the alternatives.")
    p.add_argument("--quick", action="store_true", help="fewer rounds (under a minute)")
    p.add_argument("--out", type=Path, default=REPO / ".bench" / "results.json",
                   help="results file (default: .bench/results.json)")
    p.add_argument("--only", default="",
                   help=f"comma-separated figures to run (default all): {', '.join(FIGURES)}")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, state)")
    p.add_argument("--profile", type=Path, metavar="DIR",
                   help="run py-spy on each agent; collapsed stacks go to DIR/<agent>.txt")
    p.add_argument("--portal", action="store_true",
                   help="instead: the portal under 10,000 nodes' heartbeats, SQLite and "
                        "PostgreSQL side by side (harness/bench/portal.py); results in "
                        ".bench/portal.json")
    p.add_argument("--portal-nodes", type=int, default=10_000, metavar="N",
                   help="with --portal: simulated nodes (default 10,000, one report each 10 s)")
    p.add_argument("--portal-seconds", type=float, default=60.0, metavar="S",
                   help="with --portal: how long the load runs per store (default 60)")
    p.add_argument("--portal-workers", type=int, default=2, metavar="N",
                   help="with --portal: the portal's --workers (default 2: one per core of the "
                        "2-core machine the targets are for)")
    p.add_argument("--portal-stores", default="sqlite,postgresql", metavar="LIST",
                   help="with --portal: which stores (default sqlite,postgresql)")
    p.add_argument("--portal-serve-args", default="", metavar="ARGS",
                   help="with --portal: more options for the portal (`oarbank-portal serve`), "
                        "shell-quoted, e.g. '--ingest-linger-ms 2' to measure a setting "
                        "against its default side by side")
    p.add_argument("--portal-sweep", default="", metavar="RATES",
                   help="with --portal: instead, in steady state, each of these rates "
                        "(e.g. 250,500,1000), the highest held with p99 <= 100 ms, 2x it "
                        "(backpressure) and, on PostgreSQL, one vs two portal processes "
                        "(harness/bench/portal_sweep.py); results in .bench/portal_sweep.json")
    p.add_argument("--multi-model", action="store_true",
                   help="instead: one node, a memory budget for one model, 3 modules in turn "
                        "(60 jobs; --quick 12): total job wait with demand eviction against "
                        "the node without it, and model loads against their lower bound "
                        "(harness/bench/multimodel.py); results in .bench/multi_model.json")
    p.add_argument("--fleet", action="store_true",
                   help="instead: fleet dispatch: a simulated fleet on the portal's placement "
                        "code, claim throughput on SQLite and PostgreSQL with 1,000 nodes, "
                        "4 real agents warm-aware against warm-blind, and faults (an agent and "
                        "the portal killed, PostgreSQL restarted) (harness/bench/fleet.py); "
                        "results in .bench/fleet.json")
    p.add_argument("--fleet-parts", default="sim,claims,nodes,faults", metavar="LIST",
                   help="with --fleet: which parts (default sim,claims,nodes,faults)")
    return p


def run_bench(quick: bool, only: list[str], keep: bool = False,
              profile: Path | None = None) -> dict[str, Any]:
    params = QUICK if quick else FULL
    results: dict[str, Any] = {
        "schema": SCHEMA, "quick": quick, "started_at": time.time(),
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "params": params.__dict__ | {"connect_parallel": list(params.connect_parallel)},
        "figures": {},
    }
    bench = Bench(params, quick, keep, profile)
    try:
        for key, fig in FIGURES.items():
            if only and key not in only:
                continue
            t0 = time.monotonic()
            print(f"bench: {fig.TITLE} ...", file=sys.stderr, flush=True)
            bench.begin_figure(key)
            try:
                out = fig.run(bench)
                prof = bench.figure_profile(key)
                if prof is not None:
                    out["profile"] = prof
            except Exception as exc:
                bench.failed = True
                traceback.print_exc()
                out = {"title": fig.TITLE, "metrics": {},
                       "error": f"{type(exc).__name__}: {exc}"}
            out["seconds"] = round(time.monotonic() - t0, 2)
            results["figures"][key] = out
    finally:
        bench.close()
    results["seconds"] = round(time.time() - results["started_at"], 2)
    return results


def _portal(args: argparse.Namespace) -> int:
    from .portal import run_portal_bench

    stores = tuple(x.strip() for x in args.portal_stores.split(",") if x.strip())
    if not stores or set(stores) - {"sqlite", "postgresql"}:
        print("bench: --portal-stores takes sqlite, postgresql or both", file=sys.stderr)
        return 2
    if args.portal_sweep:
        import json

        from .portal_sweep import run_portal_sweep

        rates = [float(x) for x in args.portal_sweep.split(",") if x.strip()]
        out = args.out.with_name("portal_sweep.json")
        swept = run_portal_sweep(nodes=args.portal_nodes, rates=rates,
                                 seconds=args.portal_seconds, workers=args.portal_workers,
                                 stores=stores)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(swept, indent=2) + "\n")
        print(json.dumps(swept, indent=2))
        return 0
    out = args.out.with_name("portal.json")
    results = run_portal_bench(nodes=args.portal_nodes, seconds=args.portal_seconds,
                               stores=stores, workers=args.portal_workers,
                               serve_args=tuple(shlex.split(args.portal_serve_args)), out=out)
    print(results["table"])
    print(f"\nportal bench: {len(stores)} store(s), {args.portal_nodes} nodes, "
          f"{args.portal_seconds:g} s each, {args.portal_workers} portal worker(s); load average "
          f"{results['load_average_at_start'][0]:.1f} at the start, "
          f"{results['load_average_at_end'][0]:.1f} at the end on {os.cpu_count()} CPUs; "
          f"results in {out}")
    return 1 if any("error" in v for v in results["stores"].values()) else 0


def _multi_model(args: argparse.Namespace) -> int:
    from . import multimodel

    out = args.out.with_name("multi_model.json")
    results = multimodel.run_multi_model(args.quick, args.keep)
    multimodel.write(out, results)
    print(multimodel.summary(results))
    print(f"\n{'quick' if args.quick else 'full'} multi-model bench: {results['seconds']:.1f} s; "
          f"results in {out}")
    return 0


def _fleet(args: argparse.Namespace) -> int:
    from . import fleet

    parts = tuple(x.strip() for x in args.fleet_parts.split(",") if x.strip())
    if not parts or set(parts) - set(fleet.PARTS):
        print(f"bench: --fleet-parts takes {', '.join(fleet.PARTS)}", file=sys.stderr)
        return 2
    stores = tuple(x.strip() for x in args.portal_stores.split(",") if x.strip())
    out = args.out.with_name("fleet.json")
    results = fleet.run_fleet(args.quick, parts, args.keep, stores)
    fleet.write(out, results)
    print(fleet.table(results))
    print(f"\n{'quick' if args.quick else 'full'} fleet bench: {results['seconds']:.1f} s; load "
          f"average {results['load_average_at_start'][0]:.1f} at the start, "
          f"{results['load_average_at_end'][0]:.1f} at the end on {os.cpu_count()} CPUs; "
          f"results in {out}")
    return 1 if any("error" in results[p] for p in parts) else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.fleet:
        return _fleet(args)
    if args.portal:
        return _portal(args)
    if args.multi_model:
        return _multi_model(args)
    only = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = [x for x in only if x not in FIGURES]
    if unknown:
        print(f"bench: unknown figure(s) {', '.join(unknown)}; known: {', '.join(FIGURES)}",
              file=sys.stderr)
        return 2
    results = run_bench(args.quick, only, args.keep, args.profile)
    write_results(args.out, results)
    print(table(results))
    where = where_time_goes(results)
    if where:
        print("\nwhere the time goes, for each figure that missed a target:")
        print("\n".join(where))
    print(f"\n{'quick' if args.quick else 'full'} bench: {results['seconds']:.1f}s; "
          f"results in {args.out}")
    return 1 if any(f.get("error") for f in results["figures"].values()) else 0
