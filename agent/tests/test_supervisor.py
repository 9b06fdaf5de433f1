"""The supervisor's effects through a real agent.

A service that becomes held while it is still starting is stopped at once: the start is
cancelled, its process group ended and its channel closed, no failure is counted against the
restart policy, and the row shows the hold. When the hold lifts, the waiting job runs."""

from __future__ import annotations

import json
import time
from pathlib import Path

from agent_helpers import alive, read_jsonl, write_module

from oarbank_agent.operate import control

MODULE = "test.agent.echo"


def test_a_hold_cancels_a_start_in_flight(start_agent, tmp_path: Path) -> None:
    # load_s 120 keeps it starting far longer than the test; max_failures 1 would withdraw it
    # at the first counted failure.
    mod = write_module(tmp_path / "m", service={
        "start_timeout_s": 120, "stop_timeout_s": 5,
        "restart": {"backoff_initial_s": 0.1, "backoff_max_s": 0.2, "max_failures": 1}})
    agent = start_agent([mod], {"echo": {"load_s": 120}})
    fds_before = agent.fd_count()
    job_id = agent.submit("echo", {"requests": 1})
    events = agent.module_data() / "events.jsonl"
    agent.wait_for(lambda: any(e["event"] == "hello" for e in read_jsonl(events)),
                   timeout=30, what="the daemon's hello (it is loading now)")
    daemon = next(e["pid"] for e in read_jsonl(events) if e["event"] == "daemon")
    assert agent.service_row()["running"] and not agent.service_row()["ready"]

    t0 = time.monotonic()
    reply = control.request(agent.state_dir, {"op": "protect", "rule": "evict"})
    assert reply["ok"], reply
    agent.wait_for(lambda: not agent.service_row()["running"], timeout=20,
                   what="the starting service to be stopped by the hold")
    took = time.monotonic() - t0
    row = agent.service_row()
    assert row["held"] == "preempt_protection", row
    # No failure counted: with max_failures 1 a failure would have withdrawn it.
    assert (row["withdrawn"], row["error"]) == (False, None), row
    assert not alive(daemon), "the daemon of the cancelled start is still alive"
    assert not any(e["event"] == "ready" for e in read_jsonl(events))  # never got ready
    assert "start cancelled by the hold preempt_protection" in agent.log()
    assert "(failed)" not in agent.log()
    # The agent's channel end is closed: its descriptors are back to where they were.
    agent.wait_fds_back(fds_before, timeout=10)
    rec = next(j for j in agent.status()["jobs"] if j["job_id"] == job_id)
    assert rec["state"] == "queued", rec  # released: waits for the hold to lift
    print(f"start cancelled {took:.2f}s after the hold")

    # The hold lifts: the job brings the service back and runs on it.
    settings = agent.state_dir / "modules" / MODULE / "settings.json"
    settings.write_text(json.dumps({"load_s": 0}))
    assert control.request(agent.state_dir, {"op": "protect", "rule": "end-evict"})["ok"]
    rec = agent.wait(job_id, timeout=60)
    assert rec["state"] == "succeeded", rec
    assert rec["result"]["payload"]["pids"][0] != daemon
