"""OARBANK_AGENT_FAULT (test only): each fault really breaks its behaviour, is never on
silently (log, `status`), and an unknown value refuses to start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from agent_helpers import alive, read_jsonl, write_module

from oarbank_agent import faults

MODULE = "test.agent.echo"


def _fault_env(value: str) -> dict[str, str]:
    return dict(os.environ, OARBANK_AGENT_FAULT=value)


def test_an_unknown_fault_refuses_to_start(tmp_path: Path, echo_module: Path) -> None:
    state = tmp_path / "state"
    r = subprocess.run([sys.executable, "-m", "oarbank_agent", "run", "--state-dir", str(state),
                        "--module", str(echo_module)], capture_output=True, text=True,
                       timeout=60, env=_fault_env("no_idle_stopp"))
    assert r.returncode == 2, r
    assert "OARBANK_AGENT_FAULT='no_idle_stopp' is not a known fault" in r.stderr
    assert "keep_predecessor_groups, no_idle_stop" in r.stderr
    assert not state.exists()


def test_no_idle_stop_keeps_an_idle_service_up_and_says_so(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"idle_timeout_s": 0.5})
    agent = start_agent([mod], env=_fault_env(faults.NO_IDLE_STOP))
    assert agent.run_job("echo", {"requests": 1})["state"] == "succeeded"
    idle_from = time.monotonic()
    # Loud: the agent's log, `status --json` and the status table all say it.
    assert "FAULT INJECTED (test only): OARBANK_AGENT_FAULT=no_idle_stop" in agent.log()
    st = json.loads(agent.cli("status", "--state-dir", str(agent.state_dir), "--json").stdout)
    assert st["fault"] == "no_idle_stop"
    table = agent.cli("status", "--state-dir", str(agent.state_dir)).stdout
    assert "FAULT INJECTED (test only): OARBANK_AGENT_FAULT=no_idle_stop" in table
    # Well past idle_timeout_s with no users, it is still up (a healthy agent stops it
    # after 0.5 s: test_services.py :: test_idle_stop_and_restart_on_demand).
    agent.wait_for(lambda: time.monotonic() - idle_from > 3, 10, "3 s of idleness")
    row = agent.service_row()
    assert row["running"] and row["ready"] and row["users"] == 0, row
    ops = [e["op"] for e in read_jsonl(agent.module_data() / "events.jsonl")
           if e["event"] == "op"]
    assert "stop" not in ops, ops


def test_keep_predecessor_groups_leaves_the_old_runner_running(start_agent, tmp_path: Path,
                                                               echo_module: Path) -> None:
    state = tmp_path / "state"
    first = start_agent([echo_module], state_dir=state)
    first.submit("plain", {"sleep_s": 120})
    runs = first.module_data() / "runs.jsonl"
    first.wait_for(lambda: any(e["event"] == "sleep" for e in read_jsonl(runs)), 30,
                   "the runner to sleep")
    [old] = [e["pid"] for e in read_jsonl(runs) if e["event"] == "start"]
    first.kill_with_watcher()

    broken = start_agent([echo_module], state_dir=state,
                         env=_fault_env(faults.KEEP_PREDECESSOR_GROUPS))
    # Recovery runs before the agent is ready: a healthy one would have ended it by now
    # (test_recovery.py, test_cli.py :: test_restarted_agent_ends_leftovers_and_resumes_jobs).
    assert alive(old), "the predecessor's runner was ended despite the fault"
    assert broken.status()["fault"] == "keep_predecessor_groups"
    assert "OARBANK_AGENT_FAULT=keep_predecessor_groups" in broken.log()
    broken.kill_with_watcher()  # its watcher would end the recorded leftover as it went
    assert alive(old)

    # The same state dir without the fault: the leftover is ended, as it should be.
    healthy = start_agent([echo_module], state_dir=state)
    assert not alive(old)
    assert healthy.status()["fault"] is None
