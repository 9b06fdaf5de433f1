"""`manual` services are fingerprinted again periodically (``--manual-refresh-s``): tokens that
appear later wake the jobs waiting for them, and health changes show in the service row."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from agent_helpers import read_jsonl, write_module

MODULE = "test.agent.echo"


def set_settings(agent, value: dict) -> None:  # type: ignore[no-untyped-def]
    # The agent's copy of this node's settings, which every op reads when it runs.
    path = agent.state_dir / "modules" / MODULE / "settings.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def job(agent, job_id: str) -> dict:  # type: ignore[no-untyped-def]
    return next(j for j in agent.status()["jobs"] if j["job_id"] == job_id)


def test_manual_tokens_that_appear_later_wake_the_waiting_job(start_agent,
                                                              tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"lifecycle": "manual", "endpoint": False})
    agent = start_agent([mod], {"echo": {"slots": 0}}, extra_args=["--manual-refresh-s", "0.3"])
    job_id = agent.submit("echo", {})
    agent.wait_for(lambda: "no tokens" in (job(agent, job_id).get("reason") or ""),
                   timeout=10, what="the job to say it waits for tokens")
    assert job(agent, job_id)["state"] == "queued"

    set_settings(agent, {"slots": 1})  # whoever runs the manual service gave it capacity
    rec = agent.wait(job_id, timeout=20)
    assert rec["state"] == "succeeded", rec
    assert agent.service_row()["health"] == "healthy"

    set_settings(agent, {"slots": 1, "health": "unhealthy"})
    agent.wait_for(lambda: agent.service_row()["health"] == "unhealthy", timeout=10,
                   what="the row to show the new health")
    # Still only fingerprinted: the agent never started, stopped or asked anything else.
    ops = {e["op"] for e in read_jsonl(agent.module_data() / "events.jsonl")
           if e["event"] == "op"}
    assert ops == {"fingerprint"}, ops
    fps = [e for e in read_jsonl(agent.module_data() / "events.jsonl")
           if e["event"] == "op" and e["op"] == "fingerprint"]
    assert len(fps) >= 3  # at start, then refreshed


def test_manual_refresh_default_does_not_poll_fast(start_agent, tmp_path: Path) -> None:
    # The default period is 30 s: a freshly started agent has asked exactly once.
    mod = write_module(tmp_path / "m", service={"lifecycle": "manual", "endpoint": False})
    agent = start_agent([mod], {"echo": {"slots": 1}})

    def fps() -> list[dict]:
        return [e for e in read_jsonl(agent.module_data() / "events.jsonl")
                if e["event"] == "op" and e["op"] == "fingerprint"]

    agent.wait_for(lambda: len(fps()) >= 1, timeout=30, what="the fingerprint at start")
    # The window: a job through the agent (its loop runs: a stalled agent would hide a fast
    # poll), ending at least 1 s after the first fingerprint began. A period under 1 s (a
    # default in ms, or the 0.3 s the test above asks for) would have asked a second time.
    assert agent.run_job("echo", {"sleep_s": 1.0})["state"] == "succeeded"
    agent.wait_for(lambda: time.time() > fps()[0]["t"] + 1.0, timeout=5, what="1 s after it")
    assert len(fps()) == 1, fps()


def test_manual_refresh_option_is_checked(tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"lifecycle": "manual", "endpoint": False})
    res = subprocess.run([sys.executable, "-m", "oarbank_agent", "run", "--state-dir",
                          str(tmp_path / "state"), "--module", str(mod),
                          "--manual-refresh-s", "0"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--manual-refresh-s must be > 0" in res.stderr, res
