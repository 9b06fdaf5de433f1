"""yield: host protection stops a yieldable service while jobs use it; the service is held
(`preempt_memory` under real memory pressure, `preempt_protection` under an owner's evict
rule), its jobs are released and requeued, and every job finishes after the hold lifts.

Real memory pressure is made on the `local` backend: the agent's floors are set 2.5 GiB under
the memory available when the scenario starts, and a child process of the harness
(`testsupport/memhog.py`) allocates and touches memory: before the jobs, down to a little
above the soft floor; once they use the service, on under the hard floor, and keeps it there
while the scenario looks (up to its cap, whatever other work frees meanwhile). It is
skipped in favour of the host rule where that cannot be done safely: in containers (they
share the host's memory figures, and other nodes would see the pressure too) and on machines
with under 8.5 GiB free.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import psutil

from harness.e2e.scenario import Ctx, scenario
from harness.e2e.scenarios.common import FAST, loads, wait_portal, wait_row
from testsupport import memhog

GIB = 1 << 30
# The hard floor sits this far below what is available at the start: wide enough that other
# work on the machine (parallel test workers) does not cross it by itself.
HARD_BELOW_GIB = 2.5
SOFT_ABOVE_HARD_GIB = 0.25
# Before the jobs, the pressure child takes memory down to this far above the soft floor and
# holds it there; at the scenario's word it takes the rest, to this far under the hard floor.
# Fresh memory can come at 100-200 MB/s on a VM (the host backs it on first touch): the last
# stretch (0.85 GiB) lands in seconds, the whole way (3 GiB) could outlast the jobs' hold.
REST_ABOVE_SOFT_GIB = 0.3
BELOW_FLOOR_GIB = 0.3
CAP_GIB = 6.0  # ... but never more than this (other work may free memory meanwhile)
HOLD_S = 30  # how long each job holds the service


@dataclass(frozen=True)
class _Plan:
    mode: str  # "memory" (real pressure) or "rule" (the owner's evict rule)
    flags: tuple[str, ...] = ()  # the agent's floors
    rest: int = 0  # available bytes the pressure child holds before the word
    target: int = 0  # ... and after it


def _pressure_plan(ctx: Ctx) -> _Plan:
    """Real memory pressure where it can be made safely here, else the owner's rule."""
    vm = psutil.virtual_memory()
    if ctx.backend.name != "local" or vm.available < (HARD_BELOW_GIB + CAP_GIB) * GIB:
        return _Plan("rule")
    hard = (vm.available - HARD_BELOW_GIB * GIB) / vm.total
    soft = hard + SOFT_ABOVE_HARD_GIB * GIB / vm.total
    rest = int(soft * vm.total + REST_ABOVE_SOFT_GIB * GIB)
    target = int(hard * vm.total - BELOW_FLOOR_GIB * GIB)
    ctx.note(f"memory: {vm.available / GIB:.1f} of {vm.total / GIB:.1f} GiB available; floors "
             f"hard {hard:.3f} soft {soft:.3f}; the pressure child holds {rest / GIB:.1f} GiB "
             f"available before the jobs, then {target / GIB:.1f} (at most {CAP_GIB:g} GiB)")
    return _Plan("memory", ("--mem-hard-floor", f"{hard:.4f}", "--mem-soft-floor",
                            f"{soft:.4f}", "--mem-recover-margin", "0.005",
                            "--mem-sample-s", "0.5"), rest, target)


class _PressureChild:
    """testsupport's memhog, resting at the plan's level until told to go on to its target."""

    def __init__(self, plan: _Plan) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, memhog.__file__, str(plan.target), str(int(CAP_GIB * GIB)),
             "--rest", str(plan.rest)],
            stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True, start_new_session=True)

    def event(self, want: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the pressure child exited before {want!r}")
        ev: dict[str, Any] = json.loads(line)
        return ev

    def go(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self.event("crossed")

    def end(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe:
                pipe.close()


@scenario("yield", "memory pressure (or an evict rule) stops the yieldable service with its "
          "jobs released and requeued; they finish after the hold lifts", needs_portal=True)
def yield_(ctx: Ctx) -> None:
    plan = _pressure_plan(ctx)
    child = _PressureChild(plan) if plan.mode == "memory" else None
    try:
        reason = "preempt_memory" if child is not None else "preempt_protection"
        node = ctx.node("yield-a", ["fastmodel"], flags=plan.flags,
                        settings={FAST: {"load_s": 0.3, "slots": 4, "model_gb": 1.0}})
        if child is not None:  # most of the way down before the jobs (it took that meanwhile)
            ev = child.event("resting")
            ctx.note(f"pressure child resting: holds {ev['allocated'] / GIB:.1f} GiB, "
                     f"{ev['available'] / GIB:.1f} GiB available")
        # Each job holds the service: long enough that the pressure lands while they use it,
        # even on a loaded machine (the scenario checks that it did); short enough that released
        # jobs finish soon after the hold, before other work on the machine moves the floors.
        jobs = [node.submit(FAST, "generate", {"prompts": [f"y{i}"], "hold_s": HOLD_S})["job_id"]
                for i in range(3)]
        r = wait_row(ctx, node, FAST, "model", "ready with users",
                     lambda r: r["ready"] and r["users"] >= 1, 60)
        ctx.note(f"service ready with {r['users']} user(s), {len(jobs)} jobs submitted")

        if child is not None:
            ev = child.go()
            ctx.check(ev["event"] == "crossed", f"the pressure child stopped at its cap: {ev}")
            ctx.note(f"pressure child holds {ev['allocated'] / GIB:.1f} GiB "
                     f"({ev['available'] / GIB:.1f} GiB available now)")
        else:
            rr = node.cli("protect", "--state-dir", node.host_to_node(node.state_dir), "--evict")
            ctx.check(rr.rc == 0, f"protect --evict failed: {rr}")
            ctx.note("owner's rule: protect --evict")
        held = wait_row(ctx, node, FAST, "model", f"held {reason}",
                        lambda r: r["held"] == reason and not r["running"], 60)
        ctx.note(f"row: held={held['held']} running={held['running']} users={held['users']}")
        states = _states(node, jobs)
        # On a loaded machine an early job may finish before the pressure lands; the others,
        # which used the service when it did, must have been released.
        ctx.check(not all(s == "succeeded" for s in states.values()),
                  f"every job finished before the hold, so none was released: {states}")
        in_use = {j for j, st in states.items() if st != "succeeded"}
        ctx.check(not any(s in ("running",) for s in states.values()),
                  f"jobs still run while the service is held: {states}")
        ctx.check(not any(s == "failed" for s in states.values()),
                  f"a released job was counted failed: {states}")
        ctx.note(f"jobs released while held: {states}")
        ctx.check(not any("model_service.py" in p.cmdline for p in node.processes()),
                  "a model_service.py process survives the hold")
        pr = wait_portal(ctx, FAST, node, "model", f"held: {reason}",
                         lambda r: r.get("stopped_reason") == f"held: {reason}")
        ctx.note(f"portal row: state={pr['state']} stopped_reason={pr['stopped_reason']}")
    finally:
        if child is not None:
            child.end()
    if child is not None:
        ctx.note("pressure child ended")
    else:
        rr = node.cli("protect", "--state-dir", node.host_to_node(node.state_dir), "--end-evict")
        ctx.check(rr.rc == 0, f"protect --end-evict failed: {rr}")
        ctx.note("owner's rule lifted: protect --end-evict")

    records = ctx.wait_jobs(node, jobs, 180)
    final = {j: rec["state"] for j, rec in records.items()}
    why = {j: rec.get("reason") for j, rec in records.items() if rec["state"] != "succeeded"}
    ctx.check(all(s == "succeeded" for s in final.values()),
              f"after the hold: {final}; why: {why}")
    ctx.check(len(loads(node)) >= 2, f"model.loads: {loads(node)} (want a reload after the hold)")
    ctx.note(f"all {len(jobs)} jobs succeeded after the hold lifted; model loaded again "
             f"(model.loads: {len(loads(node))} lines)")
    _check_released_without_charge(ctx, node, records, in_use, reason)


def _check_released_without_charge(ctx: Ctx, node: Any, records: dict[str, dict[str, Any]],
                                   in_use: set[str], reason: str) -> None:
    """Released jobs were requeued, not charged: each record counts one attempt (the one that
    succeeded) and its history has the released attempt, with the hold's reason, uncounted."""
    released = {j for j, rec in records.items() if rec.get("released", 0) >= 1}
    ctx.check(released, f"no job was released by the hold: {records}")
    ctx.check(in_use <= released,
              f"jobs unfinished when the hold came were not released: "
              f"{sorted(in_use - released)}")
    for job_id, rec in records.items():
        ctx.check(rec["attempts"] == 1,
                  f"job {job_id} counts {rec['attempts']} attempts after {rec.get('released')} "
                  f"release(s): a released attempt was charged")
        history = json.loads(next(
            p for p in node.find_files("job.json") if p.parent.name == job_id).read_text())[
            "history"]
        outcomes = [(h["attempt"], h["outcome"]) for h in history]
        if job_id in released:
            gone = [h for h in history if h["outcome"] == "released"]
            ctx.check(len(gone) == rec["released"] and all(
                h["attempt"] is None and reason in str(h["reason"]) for h in gone),
                f"job {job_id}: history does not record its release by {reason}: {history}")
        ctx.check(outcomes[-1] == (1, "succeeded"),
                  f"job {job_id}: the last attempt should be attempt 1, succeeded: {outcomes}")
    ctx.note(f"{len(released)} job(s) released and requeued without charge: attempts 1 each, "
             f"history {[h['outcome'] for h in history]} (last job)")


def _states(node: Any, jobs: list[str]) -> dict[str, str]:
    now = node.job_states()
    return {j: now.get(j, {}).get("state", "MISSING") for j in jobs}
