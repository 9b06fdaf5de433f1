"""`python -m harness.e2e.chaos [--backend B] [--kills N] [--jobs J] [--seed S] [--keep-services]
[--out DIR]`

One node with the ledger module (`harness/e2e/modules/ledger`: each job sends `start <job>` to the
model service, works 0.05-2.5 s, sends `done <job>`, writes its result and sends `recorded
<job>`; the service appends each to its ledger):
J jobs flow in while the agent is killed with SIGKILL N times, spread over the flow, each at a
random moment (seeded; the seed and the moments are printed) while a runner is mid-work (the
ledger shows a `start` without its `done`), and restarted each time. At the end it prints what
it counted: jobs lost (submitted and not succeeded), jobs whose work was done twice (two `done`
lines in the service's ledger: counted by the service, not the agent), split into a finished
attempt run again (two `recorded`: what the agent must never do) and a runner killed between
its `done` and its result (a job's effect that its record never saw), jobs started twice,
attempts collected after a restart and re-run, model loads per kill (the lines of
`model.loads` minus the first load, divided by the kills); `chaos.json` in the out dir holds
the same. The figures are counted from the ledger, `model.loads` and the jobs' own records,
never assumed; the run fails (exit 1) only when a job is lost or a process is left, as any
scenario does (harness.e2e.runner's checks).
"""

from __future__ import annotations

import argparse
import json
import random
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.e2e.runner import run_one
from harness.e2e.scenario import Ctx, Scenario
from harness.e2e.scenarios.common import loads, service_pids
from harness.nodes.backends import make_backends
from harness.nodes.backends.base import FINAL_STATES, Node, NodeError

__all__ = ["Figures", "figures", "chaos_scenario", "main"]

KEEP = "--keep-services"
LEDGER = "dev.oarbank.e2e.ledger"
SERVICE_FILE = "ledger_service.py"  # the daemon's script, for the check that nothing is left
SUBMIT_EVERY_S = 0.4  # a job every 0.4 s (plus the submit's own time), each working
WORK_S = (0.05, 2.5)  # this long (uniform) between its `start` and its `done`
# Each kill comes this long (uniform) after a runner is seen mid-work (a `start` in the
# ledger without its `done`) in this agent's life.
KILL_AFTER_S = (0.0, 0.3)


@dataclass
class Figures:
    """What one chaos run counted."""

    kills: int
    keep_services: bool
    seed: int
    kill_moments_s: list[float]
    load_lines: list[str]
    submitted: int
    refused: int  # submits the agent did not take (no agent ran): no job was made
    states: dict[str, int]
    released: int  # attempts released by a kill, requeued without charge
    service_pids: list[int]
    jobs_on_disk: int
    done_twice: list[str] = field(default_factory=list)  # jobs with two `done` in the ledger
    # ... of which a finished runner's work was run again: more than one attempt left its
    # result.json (what the agent must never do: issue 44)
    done_twice_after_result: list[str] = field(default_factory=list)
    # ... of which an interrupted attempt's `done` reached the service and its runner was
    # killed before its result.json was whole: the window between a job's effect and its
    # record, which no agent can see (each job here had an attempt released by a kill)
    done_twice_unfinished: list[str] = field(default_factory=list)
    started_twice: list[str] = field(default_factory=list)  # ... two `start`: work re-run
    not_done: list[str] = field(default_factory=list)  # succeeded jobs with no `done`
    collected: int = 0  # jobs with an attempt collected after a restart (job records)
    rerun: int = 0  # jobs with an interrupted attempt run again (job records)

    @property
    def lost(self) -> int:
        return self.submitted - self.states.get("succeeded", 0)

    @property
    def extra_loads(self) -> int:
        return max(0, len(self.load_lines) - 1)

    @property
    def loads_per_kill(self) -> float:
        return self.extra_loads / self.kills if self.kills else 0.0

    def line(self) -> str:
        flag = "with --keep-services" if self.keep_services else "without --keep-services"
        return (f"chaos {flag}: {self.kills} SIGKILL(s) (seed {self.seed}, at "
                f"{', '.join(f'{m:.2f}' for m in self.kill_moments_s)} s after a runner was "
                f"seen mid-work): jobs lost {self.lost}, work done twice {len(self.done_twice)}"
                f" (ledger; after a finished attempt {len(self.done_twice_after_result)}, by a "
                f"runner killed between its `done` and its result "
                f"{len(self.done_twice_unfinished)}), started twice {len(self.started_twice)}, "
                f"collected after a "
                f"restart {self.collected}, re-run {self.rerun}; "
                f"model.loads {len(self.load_lines)} line(s), {self.extra_loads} extra, "
                f"{self.loads_per_kill:.2f} load(s) per kill; jobs submitted "
                f"{self.submitted}, succeeded {self.states.get('succeeded', 0)}, failed "
                f"{self.states.get('failed', 0)}, not final "
                f"{self.submitted - sum(self.states.get(s, 0) for s in FINAL_STATES)}; "
                f"attempts released and requeued {self.released}; submits refused while no "
                f"agent ran {self.refused}; service pids seen {self.service_pids}")

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "extra_loads": self.extra_loads,
                "loads_per_kill": self.loads_per_kill, "lost": self.lost}


def ledger_counts(lines: list[str]) -> dict[str, dict[str, int]]:
    """`start`/`done`/`recorded` -> job id -> how many times the service was told so."""
    out: dict[str, dict[str, int]] = {"start": {}, "done": {}, "recorded": {}}
    for line in lines:
        what, _, job = line.strip().partition(" ")
        if what in out and job:
            out[what][job] = out[what].get(job, 0) + 1
    return out


def mid_work(lines: list[str]) -> list[str]:
    """Jobs ``lines`` (the ledger since the agent's start) show started and not (yet) done."""
    seen = ledger_counts(lines)
    return [j for j, n in seen["start"].items() if n > seen["done"].get(j, 0)]


def figures(kills: int, keep: bool, seed: int, moments: list[float], load_lines: list[str],
            submitted: list[str], refused: int, records: dict[str, dict[str, Any]],
            ledger: list[str] | None = None) -> Figures:
    """The figures from what the node wrote: `model.loads`, the service's ledger and each
    job's record (job.json)."""
    states: dict[str, int] = {}
    released = collected = rerun = 0
    pids: set[int] = set()
    for job_id in submitted:
        rec = records.get(job_id, {})
        state = str(rec.get("state", "missing"))
        states[state] = states.get(state, 0) + 1
        released += int(rec.get("released") or 0)
        pids.update(service_pids(rec))
        history = rec.get("history") or []
        collected += any(h.get("collected") for h in history)
        rerun += any(str(h.get("reason", "")).startswith("the agent stopped during this "
                                                         "attempt") for h in history)
    pids.update(int(p) for p in load_lines if p.strip().isdigit())
    seen = ledger_counts(ledger or [])
    succeeded = [j for j in submitted if records.get(j, {}).get("state") == "succeeded"]
    twice = sorted(j for j, n in seen["done"].items() if n > 1)
    # a runner says `recorded` once its result.json is whole: two mean a finished attempt's
    # work was run again
    after_result = [j for j in twice if seen["recorded"].get(j, 0) > 1]
    return Figures(kills, keep, seed, moments, load_lines, len(submitted), refused, states,
                   released, sorted(pids), len(records),
                   done_twice=twice, done_twice_after_result=after_result,
                   done_twice_unfinished=[j for j in twice if j not in after_result and int(
                       records.get(j, {}).get("released") or 0) > 0],
                   started_twice=sorted(j for j, n in seen["start"].items() if n > 1),
                   not_done=[j for j in succeeded if not seen["done"].get(j)] if ledger
                   is not None else [],
                   collected=collected, rerun=rerun)


def _records(node: Node) -> dict[str, dict[str, Any]]:
    """Every job record the node wrote, by id (result included, unlike `status`)."""
    out: dict[str, dict[str, Any]] = {}
    for f in node.find_files("job.json"):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("job_id"):
            out[str(rec["job_id"])] = rec
    return out


@dataclass
class _Flow:
    """Submits a job every SUBMIT_EVERY_S in a thread until `jobs` were made (or stopped); a
    submit refused while no agent runs is counted and tried again later (it made no job)."""

    node: Node
    jobs: int
    rng: random.Random
    refused: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set() and len(self.node.jobs) < self.jobs:
            work_s = round(self.rng.uniform(*WORK_S), 2)
            try:
                self.node.submit(LEDGER, "work", {"work_s": work_s})
            except NodeError:
                self.refused += 1
            self.stop.wait(SUBMIT_EVERY_S)


def chaos_scenario(kills: int, seed: int, keep: bool, out: list[Figures],
                   jobs: int = 80) -> Scenario:
    """The run as a scenario (not registered: its kills, jobs, seed and flag are the caller's),
    so the runner's nothing-lost and nothing-left checks hold after it; its figures go to
    `out`."""

    def run(ctx: Ctx) -> None:
        node = ctx.node("chaos-a", ["ledger"], settings={LEDGER: {"load_s": 0.3, "slots": 4}},
                        start=False)
        flags = (KEEP,) if keep else ()
        ctx.start(node, *flags)
        since = 0  # the ledger's lines before this agent's start: its runners' are after

        def working() -> list[str]:
            return mid_work(node.read_lines("model.ledger")[since:])

        rng = random.Random(seed)
        flow = _Flow(node, jobs, random.Random(rng.random()))
        submitter = threading.Thread(target=flow.run, daemon=True)
        moments: list[float] = []
        submitter.start()
        try:
            for k in range(kills):
                # Spread over the flow: kill k once its share of the jobs was submitted, and
                # only while a runner is mid-work (never after the queue drained).
                share = (k + 1) * jobs // (kills + 1)
                ctx.wait_for(f"{share} jobs submitted and a runner mid-work",
                             lambda s=share: len(node.jobs) >= s and bool(working()), 120)
                moments.append(round(rng.uniform(*KILL_AFTER_S), 2))
                time.sleep(moments[-1])
                at_work = working()
                node.kill_agent()
                ctx.note(f"kill {k + 1}/{kills}: SIGKILL {moments[-1]:.2f} s after a runner was "
                         f"seen mid-work ({len(at_work)} mid-work then); model.loads "
                         f"{len(loads(node))} line(s)")
                since = len(node.read_lines("model.ledger"))
                ctx.start(node, *flags)
            submitter.join(300)  # the rest of the flow, under the last agent
        finally:
            flow.stop.set()
            submitter.join(30)
        submitted = list(node.jobs)
        ctx.wait_jobs(node, submitted, 180)
        fig = figures(kills, keep, seed, moments, loads(node), submitted, flow.refused,
                      _records(node), node.read_lines("model.ledger"))
        out.append(fig)
        ctx.note(fig.line())
        if keep:
            # With the flag a SIGTERM leaves the service warm for the next agent; one start
            # without it gives the services back to the contract's rule, so nothing is left.
            node.stop_agent()
            ctx.start(node)
            ctx.wait_for("the kept service to be stopped",
                         lambda: not [p for p in node.processes()
                                      if SERVICE_FILE in p.cmdline], 30)

    name = f"chaos{'-keep' if keep else ''}"
    return Scenario(name, f"{kills} SIGKILL(s) of the agent under a flow of {jobs} jobs", run,
                    needs_portal=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.e2e.chaos",
                                description=__doc__.split("\n\n")[1])
    p.add_argument("--backend", default="local", metavar="B",
                   help="one backend: local (default), container:<release> or vm:bookworm")
    p.add_argument("--kills", type=int, default=6, metavar="N", help="SIGKILLs (default 6)")
    p.add_argument("--jobs", type=int, default=80, metavar="J",
                   help="jobs submitted over the run (default 80)")
    p.add_argument("--seed", type=int, help="seed of the kill moments (default: a new one)")
    p.add_argument("--keep-services", action="store_true", help="run every agent with it")
    p.add_argument("--out", type=Path, default=Path(".chaos"),
                   help="folder for the run's files and chaos.json (default .chaos)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.kills < 1:
        print(f"--kills must be at least 1, not {args.kills}", file=sys.stderr)
        return 2
    if args.jobs <= args.kills:
        print(f"--jobs must be more than --kills ({args.kills}), not {args.jobs}",
              file=sys.stderr)
        return 2
    try:
        backends = make_backends(args.backend)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if len(backends) != 1:
        print(f"--backend {args.backend} names {len(backends)} backends; name one",
              file=sys.stderr)
        return 2
    [backend] = backends
    why = backend.unavailable()
    if why:
        print(f"{backend.name} cannot run here: {why}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
    print(f"chaos on {backend.name}: {args.kills} kill(s), {args.jobs} jobs, seed {seed}, "
          f"{'with' if args.keep_services else 'without'} --keep-services", flush=True)
    figs: list[Figures] = []
    backend.setup(args.out)
    try:
        res = run_one(backend, chaos_scenario(args.kills, seed, args.keep_services, figs,
                                              args.jobs), args.out)
    finally:
        backend.teardown()
    for line in res.evidence:
        print(f"  {line}")
    if figs:
        print(figs[0].line())
        (args.out / "chaos.json").write_text(json.dumps(
            {**figs[0].as_json(), "backend": backend.name, "outcome": res.outcome,
             "error": res.error}, indent=1))
    print(f"chaos on {backend.name}: {res.outcome} ({res.seconds:.1f} s)"
          + (f" - {res.error}" if res.error else ""))
    return 0 if res.passed else 1


if __name__ == "__main__":
    sys.exit(main())
