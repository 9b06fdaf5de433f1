"""A non-endpoint service whose `start` leaves nothing in its process group (its daemon detaches
into a session of its own) is watched after ready through sparse `status` polls; `running:
false` is a failure and the restart policy brings it back. Services the agent can watch through
events get no polls."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agent_helpers import read_jsonl, write_module

from oarbank_agent.services import detachedwatch
from oarbank_agent.services.ops import OpResult


def events(agent, kind: str) -> list[dict]:  # type: ignore[no-untyped-def]
    return [e for e in read_jsonl(agent.module_data() / "events.jsonl") if e["event"] == kind]


def test_a_detached_service_that_stops_running_is_restarted(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={
        "lifecycle": "always", "endpoint": False,
        "restart": {"backoff_initial_s": 0.1, "backoff_max_s": 0.2, "max_failures": 5}})
    agent = start_agent([mod], {"echo": {"detach": True}}, extra_args=["--status-poll-s", "0.3"])
    agent.wait_for(lambda: agent.service_row()["ready"], timeout=30, what="ready")
    first = events(agent, "daemon")[0]["pid"]
    assert "watching it through its status op" in agent.log()

    (agent.module_data() / "die_now").write_text("")  # the detached daemon exits
    agent.wait_for(lambda: len(events(agent, "daemon")) >= 2 and agent.service_row()["ready"],
                   timeout=30, what="the failure noticed and the service started again")
    assert events(agent, "daemon")[1]["pid"] != first
    assert "its status op says it is no longer running" in agent.log()
    assert len([e for e in events(agent, "op") if e["op"] == "start"]) == 2
    # Jobs still run on its pool afterwards.
    assert agent.run_job("echo", {})["state"] == "succeeded"


def test_a_service_with_a_live_group_gets_no_status_polls(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"lifecycle": "always", "endpoint": False})
    agent = start_agent([mod], extra_args=["--status-poll-s", "0.1"])
    agent.wait_for(lambda: agent.service_row()["ready"], timeout=30, what="ready")
    assert agent.run_job("echo", {})["state"] == "succeeded"  # takes a while: polls would show
    assert not [e for e in events(agent, "op") if e["op"] == "status"]
    assert "watching it through its status op" not in agent.log()


def test_poll_intervals_back_off_and_answers_are_read_strictly() -> None:
    assert [detachedwatch.next_interval(x, 10) for x in (10, 20, 40, 60)] == [20, 40, 60, 60]

    def res(ok: bool, doc: dict | None) -> OpResult:
        return OpResult("status", ok, 0 if ok else 1, doc, None if ok else "boom", 1)

    assert detachedwatch.verdict(res(True, {"running": True, "ready": True})) == "running"
    assert detachedwatch.verdict(res(True, {"running": False})) == "stopped"
    assert detachedwatch.verdict(res(True, {"running": "no"})) == "unknown"
    assert detachedwatch.verdict(res(False, {"running": False})) == "unknown"


def test_status_poll_option_is_checked(tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    out = subprocess.run([sys.executable, "-m", "oarbank_agent", "run", "--state-dir",
                          str(tmp_path / "state"), "--module", str(mod), "--status-poll-s", "-1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--status-poll-s must be > 0" in out.stderr, out
