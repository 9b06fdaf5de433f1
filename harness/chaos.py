"""`python -m harness.chaos [--backend B] [--kills N] [--seed S] [--keep-services] [--out DIR]`

One node with the fastmodel module: jobs keep flowing while the agent is killed with SIGKILL
N times at random moments (seeded; the seed and the moments are printed), each while a job
uses the model service, and restarted each time. At the end it prints what it counted: model
loads per kill (the lines of `model.loads` minus the first load, divided by the kills), the
jobs submitted, succeeded and failed, the attempts released and requeued, and the service
pids the jobs saw; `chaos.json` in the out dir holds the same. The figures are counted from
`model.loads` and the jobs' own records, never assumed; the run fails (exit 1) only when a
job is lost or a process is left, as any scenario does (harness.runner's checks).
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

from harness.backends import make_backends
from harness.backends.base import FINAL_STATES, Node, NodeError
from harness.runner import run_one
from harness.scenario import Ctx, Scenario
from harness.scenarios.common import FAST, loads, service_pids, wait_row

__all__ = ["Figures", "figures", "chaos_scenario", "main"]

KEEP = "--keep-services"
SUBMIT_EVERY_S = 0.4  # a job every 0.4 s (plus the submit's own time), each holding the
HOLD_S = 1.0  # service 1 s: it is in use almost all the time
# Each kill comes this long (uniform) after a job is seen using the service in this agent's
# life: a kill before the model is up would count nothing either way.
KILL_AFTER_S = (0.0, 1.5)


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

    @property
    def extra_loads(self) -> int:
        return max(0, len(self.load_lines) - 1)

    @property
    def loads_per_kill(self) -> float:
        return self.extra_loads / self.kills if self.kills else 0.0

    def line(self) -> str:
        flag = "with --keep-services" if self.keep_services else "without --keep-services"
        return (f"chaos {flag}: {self.kills} SIGKILL(s) (seed {self.seed}, at "
                f"{', '.join(f'{m:.2f}' for m in self.kill_moments_s)} s after a job used the "
                f"service): "
                f"model.loads {len(self.load_lines)} line(s), {self.extra_loads} extra, "
                f"{self.loads_per_kill:.2f} load(s) per kill; jobs submitted "
                f"{self.submitted}, succeeded {self.states.get('succeeded', 0)}, failed "
                f"{self.states.get('failed', 0)}, not final "
                f"{self.submitted - sum(self.states.get(s, 0) for s in FINAL_STATES)}; "
                f"attempts released and requeued {self.released}; submits refused while no "
                f"agent ran {self.refused}; service pids seen {self.service_pids}")

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "extra_loads": self.extra_loads,
                "loads_per_kill": self.loads_per_kill}


def figures(kills: int, keep: bool, seed: int, moments: list[float], load_lines: list[str],
            submitted: list[str], refused: int, records: dict[str, dict[str, Any]]
            ) -> Figures:
    """The figures from what the node wrote: `model.loads` and each job's record (job.json)."""
    states: dict[str, int] = {}
    released = 0
    pids: set[int] = set()
    for job_id in submitted:
        rec = records.get(job_id, {})
        state = str(rec.get("state", "missing"))
        states[state] = states.get(state, 0) + 1
        released += int(rec.get("released") or 0)
        pids.update(service_pids(rec))
    pids.update(int(p) for p in load_lines if p.strip().isdigit())
    return Figures(kills, keep, seed, moments, load_lines, len(submitted), refused, states,
                   released, sorted(pids), len(records))


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
    """Submits a job every SUBMIT_EVERY_S in a thread until stopped; a submit refused while
    no agent runs is counted, not retried (it made no job)."""

    node: Node
    refused: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            try:
                self.node.submit(FAST, "generate", {"prompts": [f"c{i}"], "hold_s": HOLD_S})
            except NodeError:
                self.refused += 1
            i += 1
            self.stop.wait(SUBMIT_EVERY_S)


def chaos_scenario(kills: int, seed: int, keep: bool, out: list[Figures]) -> Scenario:
    """The run as a scenario (not registered: its kills, seed and flag are the caller's), so
    the runner's nothing-lost and nothing-left checks hold after it; its figures go to `out`."""

    def run(ctx: Ctx) -> None:
        node = ctx.node("chaos-a", ["fastmodel"], settings={FAST: {"load_s": 0.3, "slots": 4}},
                        start=False)
        # Both runs alike but for the flag: fastmodel idles out after 3 s, and a kept
        # service's idle clock runs on through each gap, so five minutes here (as in
        # agent-upgrade); with jobs flowing it never idles either way.
        cfg = node.root / "agent.toml"
        cfg.write_text(f'{node.base_config}[services."{FAST}/model"]\nidle_timeout_s = 300\n')
        node.push(cfg)
        flags = ((KEEP,) if keep else ()) + ("--config", node.host_to_node(cfg))
        ctx.start(node, *flags)
        flow = _Flow(node)
        submitter = threading.Thread(target=flow.run, daemon=True)
        rng = random.Random(seed)
        moments: list[float] = []
        submitter.start()
        try:
            for k in range(kills):
                wait_row(ctx, node, FAST, "model", "ready with users",
                         lambda r: r["ready"] and r["users"] >= 1, 60)
                moments.append(round(rng.uniform(*KILL_AFTER_S), 2))
                time.sleep(moments[-1])
                node.kill_agent()
                ctx.note(f"kill {k + 1}/{kills}: SIGKILL {moments[-1]:.2f} s after a job used "
                         f"the service; model.loads {len(loads(node))} line(s)")
                ctx.start(node, *flags)
            time.sleep(KILL_AFTER_S[1])  # jobs after the last restart, too
        finally:
            flow.stop.set()
            submitter.join(30)
        submitted = list(node.jobs)
        ctx.wait_jobs(node, submitted, 180)
        fig = figures(kills, keep, seed, moments, loads(node), submitted, flow.refused,
                      _records(node))
        out.append(fig)
        ctx.note(fig.line())
        if keep:
            # With the flag a SIGTERM leaves the service warm for the next agent; one start
            # without it gives the services back to the contract's rule, so nothing is left.
            node.stop_agent()
            ctx.start(node, "--config", node.host_to_node(cfg))
            ctx.wait_for("the kept service to be stopped",
                         lambda: not [p for p in node.processes()
                                      if "model_service.py" in p.cmdline], 30)

    name = f"chaos{'-keep' if keep else ''}"
    return Scenario(name, f"{kills} SIGKILL(s) of the agent under a flow of jobs", run,
                    needs_portal=True)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness.chaos",
                                description=__doc__.split("\n\n")[1])
    p.add_argument("--backend", default="local", metavar="B",
                   help="one backend: local (default), container:<release> or vm:bookworm")
    p.add_argument("--kills", type=int, default=5, metavar="N", help="SIGKILLs (default 5)")
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
    print(f"chaos on {backend.name}: {args.kills} kill(s), seed {seed}, "
          f"{'with' if args.keep_services else 'without'} --keep-services", flush=True)
    figs: list[Figures] = []
    backend.setup(args.out)
    try:
        res = run_one(backend, chaos_scenario(args.kills, seed, args.keep_services, figs),
                      args.out)
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
