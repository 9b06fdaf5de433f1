"""Runs scenarios on backends and checks, after each, that nothing was lost or left."""

from __future__ import annotations

import contextlib
import re
import shutil
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from harness.e2e.report import Report, Result
from harness.e2e.scenario import Ctx, Scenario, ScenarioFailed, module_path, modules_dir
from harness.nodes.backends.base import Backend

__all__ = ["run_matrix", "run_one", "nothing_lost", "nothing_left"]

LOST_WAIT_S = 180.0  # how long unfinished jobs may still take once a scenario returns
LEFT_WAIT_S = 20.0  # how long processes may take to go after the agents stopped


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", name)


def portal_modules() -> list[Path]:
    """The portal knows every module a scenario may run: the example and harness/e2e/modules."""
    mods = [module_path("example:modelserver")]
    if modules_dir().is_dir():
        mods += sorted(p for p in modules_dir().iterdir()
                       if (p / "oarbank-module.toml").is_file())
    return mods


def nothing_lost(ctx: Ctx) -> None:
    """Every job submitted through a node reached a final state, and the one expected."""
    total = 0
    for node in ctx.nodes:
        if not node.jobs:
            continue
        if not node.agent_alive():
            raise ScenarioFailed(f"nothing lost: the agent of {node.node_id} is not running "
                                 "at the end, so its jobs cannot be checked")
        records = ctx.wait_jobs(node, node.jobs, LOST_WAIT_S)
        wrong = {}
        for job_id, rec in records.items():
            want = ctx.expected.get(job_id, ("succeeded",))
            if rec.get("state") not in want:
                wrong[job_id] = f"{rec.get('state')} (expected {'/'.join(want)}; " \
                                f"reason {rec.get('reason')!r})"
        if wrong:
            raise ScenarioFailed(f"nothing lost: jobs on {node.node_id} ended wrongly: {wrong}")
        states: dict[str, int] = {}
        for rec in records.values():
            states[rec["state"]] = states.get(rec["state"], 0) + 1
        total += len(records)
        ctx.note(f"nothing lost on {node.node_id}: {len(records)} job(s) final {states}")
    if total == 0:
        ctx.note("nothing lost: no jobs were submitted")


def nothing_left(ctx: Ctx) -> None:
    """Stop every agent (SIGTERM, as an operator would); then no process of any node may
    remain."""
    for node in ctx.nodes:
        if node.agent_alive():
            rc = node.stop_agent()
            ctx.note(f"{node.node_id}: agent stopped by SIGTERM, exit {rc}")
    deadline = time.monotonic() + LEFT_WAIT_S
    left: dict[str, list[str]] = {}
    while True:
        left = {n.node_id: [str(p) for p in n.processes()] for n in ctx.nodes}
        left = {k: v for k, v in left.items() if v}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    if left:
        raise ScenarioFailed(f"nothing left: processes survive the agents: {left}")
    ctx.note(f"nothing left: no process of {len(ctx.nodes)} node(s) survives")


def sandbox_walls(ctx: Ctx) -> dict[str, str] | None:
    """The first live agent's sandbox walls (its `status`), noted as evidence."""
    for node in ctx.nodes:
        if not node.agent_alive():
            continue
        with contextlib.suppress(Exception):
            sb = node.status().get("sandbox") or {}
            walls = {k: str(v) for k, v in sb.items() if isinstance(v, str)}
            on = sorted(k for k, v in walls.items() if v == "enforced")
            off = sorted(k for k, v in walls.items() if v == "unavailable")
            ctx.note(f"sandbox ({walls.get('mode', '?')}): enforced: {', '.join(on) or '-'}; "
                     f"unavailable: {', '.join(off) or '-'}")
            return walls
    return None


def missing_walls(needed: tuple[str, ...], walls: dict[str, str] | None) -> list[str]:
    """The walls of `needed` the node's agent does not enforce (all of them when no agent
    said)."""
    return [w for w in needed if (walls or {}).get(w) != "enforced"]


def run_one(backend: Backend, sc: Scenario, out: Path, agent_flags: tuple[str, ...] = ()
            ) -> Result:
    folder = out / "runs" / _safe(backend.name) / sc.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    ctx = Ctx(backend, folder, agent_flags)
    t0 = time.monotonic()
    error: str | None = None
    walls: dict[str, str] | None = None
    try:
        if sc.needs_portal:
            from harness.e2e.portal import Portal

            ctx.portal = Portal(ctx.place("portal"), portal_modules(),
                                tcp=backend.portal_over_tcp)
            ctx.note(f"portal serving at {ctx.portal.url}")
        sc.fn(ctx)
        walls = sandbox_walls(ctx)
        if sc.walls:
            lacking = missing_walls(sc.walls, walls)
            ctx.check(not lacking, f"this node's kernel lacks wall(s) the evidence rests on: "
                                   f"{', '.join(lacking)} (status: {walls})")
            ctx.note(f"walls the evidence rests on, enforced here: {', '.join(sc.walls)}")
        nothing_lost(ctx)
        nothing_left(ctx)
    except ScenarioFailed as exc:
        error = str(exc)
    except Exception as exc:  # a harness or node error is a failure of this cell, not a crash
        error = f"{type(exc).__name__}: {exc}"
        (folder / "traceback.txt").write_text(traceback.format_exc())
    finally:
        for node in ctx.nodes:
            with contextlib.suppress(Exception):
                node.cleanup()
        if ctx.portal is not None:
            with contextlib.suppress(Exception):
                ctx.portal.stop()
        log_tails = {n.node_id: n.log_tail(600) for n in ctx.nodes}
        ctx.bring_back()
    leftovers = backend.leftovers()
    if leftovers and error is None:
        error = f"nothing left: after cleanup the backend still has {leftovers}"
    if error is not None:
        for node_id, tail in log_tails.items():
            ctx.evidence.append(f"{node_id} agent.log tail: {tail}")
    return Result(sc.name, backend.name, error is None, time.monotonic() - t0,
                  ctx.evidence, error, walls)


def run_matrix(backends: list[Backend], scenarios: list[Scenario], out: Path,
               agent_flags: tuple[str, ...] = (), required: bool = False,
               progress: Callable[[str], None] = lambda s: print(s, flush=True)) -> Report:
    """Every scenario on every backend. A backend this machine cannot run is skipped with its
    reason, or, when `required` (the user named it), counted as failed for every scenario."""
    report = Report()
    total = len(backends) * len(scenarios)
    i = 0
    for backend in backends:
        why = backend.unavailable()
        setup_error = None
        if why is None:
            try:
                t0 = time.monotonic()
                progress(f"[setup] {backend.name} ...")
                facts = backend.setup(out)
                report.setup[backend.name] = {**facts, "setup_s": round(time.monotonic() - t0, 1)}
                progress(f"[setup] {backend.name} ready in {time.monotonic() - t0:.1f} s {facts}")
            except Exception as exc:
                setup_error = f"setting up {backend.name} failed: {type(exc).__name__}: {exc}"
                progress(f"[setup] {setup_error}")
        elif not required:
            report.skipped_backends[backend.name] = why
            progress(f"[skip] {backend.name}: {why}")
            i += len(scenarios)
            continue
        else:
            setup_error = f"{backend.name} cannot run here: {why}"
        try:
            for sc in scenarios:
                i += 1
                progress(f"[{i}/{total}] {sc.name} on {backend.name} ...")
                if setup_error:
                    res = Result(sc.name, backend.name, False, 0.0, [], setup_error)
                else:
                    res = run_one(backend, sc, out, agent_flags)
                report.results.append(res)
                line = f"[{i}/{total}] {sc.name} on {backend.name}: {res.outcome} " \
                       f"({res.seconds:.1f} s)"
                if res.error:
                    line += f" - {res.error[:300]}"
                progress(line)
        finally:
            if setup_error is None:
                with contextlib.suppress(Exception):
                    backend.teardown()
    report.finished = time.time()
    return report
