"""The backends on a trivial module: start, submit, status, stop, kill -9, restart, cleanup,
and that "nothing left" catches a process that escaped the agent."""

from __future__ import annotations

from pathlib import Path

from harness_test_helpers import ECHO, ECHO_ID

from harness.e2e.runner import run_one
from harness.e2e.scenario import Ctx, Scenario
from harness.nodes.backends import Backend


def test_start_submit_stop_cleanup(backend: Backend, tmp_path: Path) -> None:
    node = backend.make_node("n1", tmp_path / "n1", [ECHO], {}, None)
    try:
        node.start_agent()
        assert node.agent_alive()
        st = node.status()
        assert st["node_id"] == "n1"
        rec = node.submit(ECHO_ID, "echo", {"x": 1}, wait=True, timeout_s=60)
        assert rec["state"] == "succeeded", rec
        assert rec["result"]["payload"] == {"x": 1}
        assert node.jobs == [rec["job_id"]]
        # Its pids are the node's own (a container's, not the host's): the agent's lock
        # names the agent as the node sees it, as jobs' results and services' files do.
        agent_pid = int((node.state_dir / "agent.lock").read_text().split()[0])
        assert agent_pid in {p.pid for p in node.processes()}, node.processes()
        assert node.stop_agent() == 0
        assert not node.agent_alive()
        assert node.processes() == []
        assert "harness: start #1" in (node.root / "agent.log").read_text()
    finally:
        node.cleanup()
    assert backend.leftovers() == []


def test_kill_9_then_restart_on_the_same_state(backend: Backend, tmp_path: Path) -> None:
    node = backend.make_node("n2", tmp_path / "n2", [ECHO], {}, None)
    try:
        node.start_agent()
        job = node.submit(ECHO_ID, "echo", {"y": 2}, wait=True, timeout_s=60)["job_id"]
        node.kill_agent()
        assert not node.agent_alive()
        assert node.agent_exit_code() in (-9, 137), node.agent_exit_code()
        node.start_agent()
        assert node.agent_starts == 2
        assert node.job_states()[job]["state"] == "succeeded"
        refused = node.submit_raw("--module", ECHO_ID, "--stage", "echo", "--payload", "{bad")
        assert refused.rc == 2, refused
    finally:
        node.cleanup()
    assert node.processes() == []
    assert backend.leftovers() == []


def _escape(ctx: Ctx) -> None:
    # Process-group containment: with cgroups (the agent's default where it can) the agent
    # itself ends the escaped process, and this test is about the harness noticing one.
    node = ctx.node("esc", [ECHO], flags=("--containment", "process-group"))
    rec = node.submit(ECHO_ID, "echo", {"escape_s": 120}, wait=True, timeout_s=60)
    ctx.check(rec["state"] == "succeeded", f"echo job: {rec}")


def test_nothing_left_catches_an_escaped_process(backend: Backend, tmp_path: Path) -> None:
    res = run_one(backend, Scenario("escape", "a runner leaves a process behind", _escape),
                  tmp_path)
    assert not res.passed
    assert res.error is not None and res.error.startswith("nothing left: processes survive")
    assert "time.sleep(120)" in res.error
    assert any(e.startswith("esc agent.log tail:") for e in res.evidence)
    # The harness cleaned up after the failed check: nothing of the run remains.
    assert backend.leftovers() == []
    from harness.nodes.procs import processes_under

    assert processes_under(tmp_path) == []
