"""agent-upgrade: with `--keep-services` the model stays warm across an agent restart. `kill -9`
of the agent while jobs use the service, then a newer agent version installed and SIGTERM +
start (the newer one): the same service process serves the jobs after each restart and the
model is never loaded again; without the flag, the contract's rule (the next agent stops the
kept service and a new one loads)."""

from __future__ import annotations

from harness.e2e.scenario import Ctx, scenario
from harness.e2e.scenarios.common import FAST, loads, service_pids, submit_all, wait_row
from harness.nodes.backends.base import Node

KEEP = "--keep-services"


def _model_pids(node: Node) -> set[int]:
    return {p.pid for p in node.processes() if "model_service.py" in p.cmdline}


def _bumped(version: str) -> str:
    """The next patch version: 0.1.0 -> 0.1.1."""
    parts = version.split(".")
    return ".".join([*parts[:-1], str(int(parts[-1]) + 1)])


def _served(ctx: Ctx, node: Node, tag: str, n: int = 2) -> set[int]:
    recs = submit_all(node, FAST, "generate", [{"prompts": [f"{tag}{i}"]} for i in range(n)])
    ctx.check(all(r["state"] == "succeeded" for r in recs),
              f"jobs {tag}: {[(r['state'], r.get('reason')) for r in recs]}")
    return {p for r in recs for p in service_pids(r)}


@scenario("agent-upgrade", "with --keep-services, kill -9, then a newer agent installed and "
          "SIGTERM + start keep the model warm: 0 extra loads, the same service pid, jobs "
          "after each restart served by it; without the flag the restarted agent loads it "
          "again",
          needs_portal=True)
def agent_upgrade(ctx: Ctx) -> None:
    node = ctx.node("upgrade-a", ["fastmodel"], settings={FAST: {"load_s": 0.3, "slots": 4}},
                    start=False)
    # fastmodel idles out after 3 s, and a kept service's idle clock goes on through the gap
    # (it would be stopped at once once taken back): five minutes here, per node, as operators
    # do. A minute was too short on a VM under TCG: the newer agent's install and the restart
    # left the service unused for 60 s once, and it idled out before the jobs that check it.
    cfg = node.root / "agent.toml"
    cfg.write_text(f'{node.base_config}[services."{FAST}/model"]\nidle_timeout_s = 300\n')
    node.push(cfg)
    keep = (KEEP, "--config", node.host_to_node(cfg))
    ctx.start(node, *keep)
    (pid,) = _served(ctx, node, "w", 1)
    ctx.check(loads(node) == [str(pid)], f"model.loads after the first job: {loads(node)}")
    ctx.note(f"model loaded once, by pid {pid}")

    # 1. kill -9 while jobs hold the service: it outlives the agent, its channel kept.
    held = [node.submit(FAST, "generate", {"prompts": [f"h{i}"], "hold_s": 5})["job_id"]
            for i in range(2)]
    wait_row(ctx, node, FAST, "model", "ready with users", lambda r: r["users"] >= 1, 60)
    node.kill_agent()
    ctx.check(pid in _model_pids(node), "the model service did not outlive the killed agent")
    ctx.note("agent killed with SIGKILL while jobs used the service; the service runs on")
    ctx.start(node, *keep)
    after_kill = _served(ctx, node, "k")
    records = ctx.wait_jobs(node, held, 120)
    ctx.check(all(r["state"] == "succeeded" for r in records.values()),
              f"jobs held at the kill: {[r['state'] for r in records.values()]}")
    ctx.check(after_kill == {pid}, f"jobs after the kill saw {after_kill}, not {pid}")
    ctx.check(loads(node) == [str(pid)], f"model.loads after the kill: {loads(node)}")
    ctx.note(f"after kill -9: jobs served by the same pid {pid}; loads {loads(node)}")

    # 2. A newer agent is installed, then SIGTERM and start: the agent stops, the service
    # does not, and the newer agent takes it back (nothing in re-adoption reads the agent's
    # own version; the module's version, settings and manifest are what must match).
    before = str(node.status().get("agent_version"))
    newer = _bumped(before)
    why_not = node.install_agent(newer)
    if why_not is None:
        ctx.note(f"agent {newer} installed while agent {before} runs")
    else:
        ctx.note(f"no newer agent on this backend ({why_not}): the same version restarts")
    if node.supervisor == "systemd":
        # `systemctl restart`, as a package upgrade does: the unit's descriptor store is
        # kept across it (a stop, then a start, flushes it on systemd before 254).
        node.restart_agent(*keep, *ctx.agent_flags)
        ctx.note(f"{node.node_id}: systemctl restart (start #{node.agent_starts})")
    else:
        rc = node.stop_agent()
        ctx.check(rc == 0, f"the agent exited {rc} on SIGTERM")
        ctx.check(pid in _model_pids(node),
                  "the model service did not outlive the stopped agent")
        ctx.start(node, *keep)
    running = str(node.status().get("agent_version"))
    if why_not is None:
        ctx.check(running == newer, f"the restarted agent says version {running}, not {newer}")
    after_stop = _served(ctx, node, "t")
    ctx.check(after_stop == {pid}, f"jobs after SIGTERM + start of agent {running} saw "
              f"{after_stop}, not {pid}")
    ctx.check(loads(node) == [str(pid)], f"model.loads after SIGTERM + start: {loads(node)}")
    ctx.note(f"after SIGTERM + start of agent {running}: the same pid {pid}; "
             f"loads {loads(node)}")

    # 3. Without the flag: the contract's rule; the keeper gives everything back and exits.
    node.stop_agent()
    if node.supervisor == "systemd":
        # A stop that no start follows: systemd (before 254) empties the unit's descriptor
        # store once the unit is stopped, so the kept service's channel closes and it exits
        # by itself (KillMode=process leaves that to it); no model outlives `systemctl stop`.
        ctx.wait_for("the kept service to exit after systemctl stop",
                     lambda: pid not in _model_pids(node), 60, interval_s=2.0)
        ctx.note(f"systemctl stop (no start after it): the kept service (pid {pid}) exited "
                 "once its channel closed")
    ctx.start(node, "--config", node.host_to_node(cfg))
    ctx.wait_for("the kept service to be stopped", lambda: pid not in _model_pids(node), 30)
    (new,) = _served(ctx, node, "o", 1)
    lines = loads(node)
    ctx.check(new != pid and lines == [str(pid), str(new)],
              f"without --keep-services: jobs saw {new}, model.loads {lines}")
    ctx.check(not [p for p in node.processes() if "oarbank_agent.keep" in p.cmdline],
              "the keeper outlived the agent that took its channels back")
    ctx.note(f"without the flag: the old service stopped, a new one loaded (loads {lines})")
