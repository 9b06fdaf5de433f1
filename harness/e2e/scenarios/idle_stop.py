"""idle-stop: an on_demand service stops after idle_timeout_s with no users, and the next job
starts it again (one more model load)."""

from __future__ import annotations

from harness.e2e.scenario import Ctx, scenario
from harness.e2e.scenarios.common import (
    FAST,
    loads,
    service_pids,
    submit_all,
    wait_portal,
    wait_row,
)

IDLE_S = 3.0  # harness/e2e/modules/fastmodel: idle_timeout_s


@scenario("idle-stop", "jobs finish; after idle_timeout_s the service is stopped (idle) and "
          "its processes gone; the next job starts it again", needs_portal=True)
def idle_stop(ctx: Ctx) -> None:
    node = ctx.node("idle-a", ["fastmodel"], settings={FAST: {"load_s": 0.3, "slots": 4}})

    # Three jobs at once share one load of the model.
    recs = submit_all(node, FAST, "generate",
                      [{"prompts": [f"p{i}", f"q{i}"], "hold_s": 0.5} for i in range(3)])
    ctx.check(all(r["state"] == "succeeded" for r in recs),
              f"first jobs did not all succeed: {[(r['state'], r.get('reason')) for r in recs]}")
    pids = sorted({p for r in recs for p in service_pids(r)})
    ctx.check(len(pids) == 1, f"the first jobs saw service pids {pids}, expected one")
    ctx.check(len(loads(node)) == 1, f"model.loads after the first jobs: {loads(node)}")
    first_pid = pids[0]
    ctx.note(f"3 jobs succeeded on service pid {first_pid}; model.loads has 1 line")

    # Right after the jobs the service is still up: the stop waits for the idle timeout. (The
    # node's clock: the job records and the status time both come from the agent. On a loaded
    # machine this look may come after the timeout ran out: then it proves nothing, and says so.)
    status = node.status()  # the row, the jobs' ends and the time from one answer
    ours = {r["job_id"] for r in recs}
    last_end = max(float(j["finished_at"]) for j in status["jobs"] if j["job_id"] in ours)
    [r] = [x for x in status["services"] if x["service"] == "model"]
    idle_for = float(status["time"]) - last_end
    if idle_for < IDLE_S - 0.5:
        ctx.check(r["running"] and r["users"] == 0,
                  f"{idle_for:.1f} s after the jobs (idle_timeout_s {IDLE_S:g}) the row should "
                  f"be running with 0 users: {r}")
        ctx.note(f"{idle_for:.1f} s after the jobs: running={r['running']} users={r['users']}")
    else:
        ctx.note(f"the row was first read {idle_for:.1f} s after the jobs, past idle_timeout_s: "
                 f"whether it stayed up that long is not proven by this run")

    r = wait_row(ctx, node, FAST, "model", "stopped with no users",
                 lambda r: not r["running"] and r["users"] == 0, IDLE_S + 30)
    ctx.note(f"row stopped: running={r['running']} ready={r['ready']} held={r['held']}")
    def service_procs() -> list[str]:
        return [str(p) for p in node.processes()
                if "model_service.py" in p.cmdline or "oarbank-e2e-helper" in p.cmdline]

    ctx.check(not service_procs(),
              f"processes of the service's group survive the idle stop: {service_procs()}")
    ctx.note("no process of the service's group (daemon, helper) left on the node")
    pr = wait_portal(ctx, FAST, node, "model", "state stopped, why stopped idle",
                     lambda r: r.get("state") == "stopped" and r.get("stopped_reason") == "idle")
    ctx.note(f"portal row: state={pr['state']} stopped_reason={pr['stopped_reason']}")

    # The next job starts it again: one more load, a new process.
    [again] = submit_all(node, FAST, "generate", [{"prompts": ["again"]}])
    ctx.check(again["state"] == "succeeded", f"the job after the idle stop: {again}")
    new = service_pids(again)
    ctx.check(len(loads(node)) == 2, f"model.loads after the restart: {loads(node)} (want 2)")
    ctx.check(new and new[0] != first_pid,
              f"the job after the idle stop saw pid {new}, the old one was {first_pid}")
    ctx.note(f"next job started it again: pid {new[0]}, model.loads has 2 lines")

