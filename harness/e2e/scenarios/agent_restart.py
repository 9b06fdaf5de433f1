"""agent-restart: `kill -9` the agent while jobs use the service; a new agent on the same
state dir ends the old service's process group (never adopts it), starts a new one, and every
job finishes."""

from __future__ import annotations

from harness.e2e.scenario import Ctx, scenario
from harness.e2e.scenarios.common import FAST, loads, service_pids, submit_all, wait_row


@scenario("agent-restart", "kill -9 the agent while jobs use the service; the restarted "
          "agent replaces the old service process group; every job finishes",
          needs_portal=True)
def agent_restart(ctx: Ctx) -> None:
    node = ctx.node("restart-a", ["fastmodel"], settings={FAST: {"load_s": 0.3, "slots": 4}})

    # Four jobs that hold the service for a while, so the kill lands while they use it.
    jobs = [node.submit(FAST, "generate", {"prompts": [f"r{i}"], "hold_s": 20})["job_id"]
            for i in range(4)]
    r = wait_row(ctx, node, FAST, "model", "ready with users",
                 lambda r: r["ready"] and r["users"] >= 1, 60)
    ctx.note(f"service ready with {r['users']} user(s); jobs submitted: {len(jobs)}")
    old = ctx.wait_for("the first model load", lambda: loads(node), 30)
    old_pid = old[-1]
    ctx.check(len(old) == 1, f"model.loads before the kill: {old}")
    before = [p for p in node.processes()
              if "model_service.py" in p.cmdline or "oarbank-e2e-helper" in p.cmdline]
    ctx.check(any("model_service.py" in p.cmdline for p in before),
              "no model_service.py process before the kill")
    ctx.check(any("oarbank-e2e-helper" in p.cmdline for p in before),
              "no helper in the service's process group before the kill")
    old_groups = {p.pgid for p in before}
    old_pids = {p.pid for p in before}
    ctx.note(f"old service process(es) {sorted(old_pids)} in group(s) {old_groups}, "
             f"model loaded by pid {old_pid}")

    running = {j: r.get("state") for j, r in node.job_states().items() if j in jobs}
    # On a loaded machine each `submit` can take seconds, so an early job may be done already;
    # what matters is that the kill lands while some job uses the service.
    ctx.check(any(s == "running" for s in running.values()),
              f"no job was running at the kill: the kill would prove nothing: {running}")
    node.kill_agent()
    ctx.note("agent killed with SIGKILL while jobs used the service")
    survivors = [p for p in node.processes() if p.pid in old_pids]
    ctx.note(f"after the kill, {len(survivors)} old service process(es) still run"
             + (" (orphans)" if survivors else
                f" ({node.supervisor} ended the crashed agent's unit: its cgroup)"
                if node.supervisor else " (the daemon exits on its channel's EOF)"))

    ctx.start(node)
    # The new agent ends the old group: none of its processes may remain.
    ctx.wait_for("the old service process group to be ended",
                 lambda: not [p for p in node.processes()
                              if p.pid in old_pids or (p.pgid in old_groups and p.pgid)],
                 30)
    ctx.note("old service process group ended" + (
        f" (by {node.supervisor} or the new agent)" if node.supervisor else " by the new agent"))

    new_recs = submit_all(node, FAST, "generate", [{"prompts": [f"n{i}"]} for i in range(2)])
    ctx.check(all(r["state"] == "succeeded" for r in new_recs),
              f"new jobs after the restart: {[(r['state'], r.get('reason')) for r in new_recs]}")
    new_pids = sorted({p for r in new_recs for p in service_pids(r)})
    records = ctx.wait_jobs(node, jobs, 120)
    states = {j: r["state"] for j, r in records.items()}
    ctx.check(all(s == "succeeded" for s in states.values()),
              f"jobs submitted before the kill: {states}")
    ctx.note(f"the {len(jobs)} jobs from before the kill all succeeded "
             f"(attempts {[r.get('attempts') for r in records.values()]})")
    lines = loads(node)
    ctx.check(len(lines) == 2 and lines[0] == old_pid,
              f"model.loads after the restart: {lines} (want the old load plus one)")
    ctx.check(len(new_pids) == 1 and str(new_pids[0]) == lines[-1] != old_pid,
              f"new jobs saw service pids {new_pids}; loads {lines}; old service {old_pid}")
    ctx.note(f"a new service (model.loads: {lines}) served the requeued and the new jobs "
             f"(new jobs saw pid {new_pids})")
