"""Failure paths of contract sections 2 and 3 through a real agent: withdrawal that waits with
a reason and recovers, stops that do not stop, services that die while jobs use them, process
group death of a non-endpoint service, `always` and `manual`."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from agent_helpers import MODFILES, alive, read_jsonl, write_module

MOD = "test.agent.echo"


def fault_module(root: Path, **service: Any) -> Path:
    """The echo module with fault_runner.py as its runner."""
    mod = write_module(root, service=service,
                       runner={"exec": ["python", "-I", "{bundle}/fault_runner.py"]})
    shutil.copy(MODFILES / "fault_runner.py", mod / "fault_runner.py")
    return mod


def set_settings(agent: Any, value: dict[str, Any]) -> None:
    """Change the node settings the service's ops read (the agent wrote this file)."""
    path = agent.state_dir / "modules" / MOD / "settings.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def events(agent: Any, kind: str | None = None) -> list[dict[str, Any]]:
    evs = read_jsonl(agent.module_data() / "events.jsonl")
    return [e for e in evs if kind is None or e["event"] == kind]


def job_row(agent: Any, job_id: str) -> dict[str, Any]:
    return next(j for j in agent.status()["jobs"] if j["job_id"] == job_id)


def test_withdrawn_service_jobs_wait_with_a_reason_then_it_comes_back(start_agent,
                                                                      tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={
        "restart": {"backoff_initial_s": 0.1, "backoff_max_s": 0.3, "max_failures": 2}})
    agent = start_agent([mod], {"echo": {"start_fail": True}})
    job = agent.submit("echo", {"requests": 1})
    agent.wait_for(lambda: agent.service_row()["withdrawn"], what="withdrawal")
    # An unhealthy fingerprint keeps it withdrawn: probes come and go, nothing starts.
    set_settings(agent, {"start_fail": True, "health": "unhealthy"})
    agent.wait_for(lambda: agent.log().count("withdrawn -> withdrawn (probed)") >= 2,
                   what="two failed probes")
    row = agent.service_row()
    assert row["withdrawn"] is True and row["error"], row
    rec = job_row(agent, job)
    assert rec["state"] == "queued" and rec["attempts"] == 0, rec
    assert rec["reason"].startswith("waiting: service test.agent.echo/echo is withdrawn"), rec
    assert "start exited with 1" in rec["reason"], rec
    on_disk = json.loads((agent.state_dir / "jobs" / job / "job.json").read_text())
    assert on_disk["reason"] == rec["reason"] and on_disk["state"] == "queued"
    # Healthy again: the next probe un-withdraws it, the job runs, nothing was charged.
    set_settings(agent, {})
    done = agent.wait(job, timeout=30)
    assert (done["state"], done["attempts"], done["reason"]) == ("succeeded", 1, None), done
    row = agent.service_row()
    assert (row["withdrawn"], row["ready"], row["error"]) == (False, True, None), row
    assert "un-withdrawn after a healthy fingerprint" in agent.log()


def test_a_stop_that_hangs_is_escalated_and_recorded(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"idle_timeout_s": 0.2, "stop_timeout_s": 2})
    agent = start_agent([mod], {"echo": {"stop_hang": True, "ignore_term": True,
                                               "linger_after_eof": True}})
    assert agent.run_job("echo", {"requests": 1})["state"] == "succeeded"
    (daemon,) = [e["pid"] for e in events(agent, "daemon")]
    agent.wait_for(lambda: not agent.service_row()["running"], timeout=20, what="the stop")
    row = agent.service_row()
    assert row["error"].startswith("stop escalated: the stop op did not finish within "
                                   "stop_timeout_s=2;"), row
    assert "SIGKILL" in row["error"], row  # the daemon ignores SIGTERM
    assert "stop escalated" in agent.log()
    assert events(agent, "stop_hang") and not alive(daemon)
    # The next start clears it: becoming ready is a fresh run.
    assert agent.run_job("echo", {"requests": 1})["state"] == "succeeded"
    assert agent.service_row()["error"] is None


def test_service_dying_under_jobs_releases_them_and_connects_wait_for_the_new_run(
        start_agent, tmp_path: Path) -> None:
    mod = fault_module(tmp_path / "m", start_timeout_s=10,
                       restart={"backoff_initial_s": 0.3, "backoff_max_s": 1, "max_failures": 5})
    agent = start_agent([mod])
    held = agent.submit("echo", {"mode": "persistent", "max_s": 30})
    fresh = agent.submit("echo", {"mode": "fresh", "max_s": 30})
    agent.wait_for(lambda: len({e["attempt"] for e in events(agent, "connection")}) == 2,
                   what="both jobs connected")
    (agent.module_data() / "die_now").touch()
    held_rec, fresh_rec = agent.wait(held, 60), agent.wait(fresh, 60)
    # The job whose connection died saw it closed and exited 75: its service died under it, so
    # the attempt was released, not charged (G18), and the job ran again after the restart.
    assert (held_rec["state"], held_rec["attempts"]) == ("succeeded", 1), held_rec
    record = json.loads((agent.state_dir / "jobs" / held / "job.json").read_text())
    history = record["history"]
    assert record["released"] == 1
    assert [(h["outcome"], h["exit_code"], h["attempt_id"]) for h in history] == [
        ("released", None, f"{held}.1"), ("succeeded", 0, f"{held}.2")], history
    assert history[0]["reason"].startswith(
        "service died under the attempt: test.agent.echo/echo (the service closed its channel"
    ), history[0]
    assert "the runner then said: " in history[0]["reason"]
    # Connects made while it restarted waited for the new run: none refused.
    assert fresh_rec["state"] == "succeeded", fresh_rec
    outcomes = fresh_rec["result"]["payload"]["outcomes"]
    assert not [o for o in outcomes if "error" in o], outcomes
    pids = [o["pid"] for o in outcomes if "pid" in o]
    assert pids[-1] != pids[0] and len(set(pids)) == 2, outcomes
    assert max(o["dt"] for o in outcomes) >= 0.2, outcomes  # one waited through the backoff
    assert "ready -> backoff (failed)" in agent.log()


def test_connects_fail_unavailable_after_start_timeout_while_it_backs_off(
        start_agent, tmp_path: Path) -> None:
    # start_timeout_s 4: a restart on a loaded machine must fit in it (at 2 s the new daemon
    # sometimes never made it, and the job saw no second pid).
    mod = fault_module(tmp_path / "m", start_timeout_s=4.0,
                       restart={"backoff_initial_s": 5, "backoff_max_s": 5, "max_failures": 5})
    agent = start_agent([mod])
    job = agent.submit("echo", {"mode": "fresh", "max_s": 60})
    agent.wait_for(lambda: events(agent, "connection"), what="a first connection")
    (agent.module_data() / "die_now").touch()
    rec = agent.wait(job, 90)
    assert rec["state"] == "succeeded", rec
    outcomes = rec["result"]["payload"]["outcomes"]
    refused = [o for o in outcomes if o.get("error") == "service_unavailable"]
    assert refused, outcomes
    # Each was refused once no run could come in time: at once when the backoff outlasts
    # start_timeout_s, else when the start under way failed; never later than start_timeout_s
    # after it came (4 s, and a margin for a loaded machine).
    assert all(o["dt"] < 9.0 for o in refused), refused
    pids = [o["pid"] for o in outcomes if "pid" in o]
    assert len(set(pids)) == 2 and pids[-1] != pids[0], outcomes


def test_always_non_endpoint_service_whose_group_dies_is_restarted(start_agent,
                                                                   tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={
        "lifecycle": "always", "endpoint": False,
        "restart": {"backoff_initial_s": 0.2, "backoff_max_s": 1, "max_failures": 5}})
    agent = start_agent([mod])
    agent.wait_for(lambda: agent.service_row()["ready"], what="ready")
    (agent.module_data() / "die_now").touch()
    agent.wait_for(lambda: len(events(agent, "daemon")) >= 2, timeout=30,
                   what="a second daemon after the first died")
    agent.wait_for(lambda: agent.service_row()["ready"], what="ready again")
    first, second = [e["pid"] for e in events(agent, "daemon")][:2]
    assert first != second and not alive(first) and alive(second)
    assert "died: no process of it is left" in agent.log()
    assert "ready -> backoff (failed)" in agent.log()
    # Nothing polled it: no `status` op ran, and `ready` only while starting.
    ops = [e["op"] for e in events(agent, "op")]
    assert "status" not in ops
    # Jobs on its pool run (no connector: it is not an endpoint service).
    job = agent.run_job("echo", {"env": True})
    assert job["state"] == "succeeded"
    assert "OARBANK_SERVICE_ECHO" not in job["result"]["payload"]["env"]


def test_manual_service_is_only_fingerprinted_and_its_pools_count(start_agent,
                                                                  tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"lifecycle": "manual", "endpoint": False})
    agent = start_agent([mod], {"echo": {"slots": 2}})
    ids = [agent.submit("echo", {"sleep_s": 0.4}) for _ in range(4)]
    assert [agent.wait(j)["state"] for j in ids] == ["succeeded"] * 4
    runs = read_jsonl(agent.module_data() / "runs.jsonl")
    start = {r["attempt"]: r["t"] for r in runs if r["event"] == "start"}
    end = {r["attempt"]: r["t"] for r in runs if r["event"] == "end"}
    points = sorted([(t, 1) for t in start.values()] + [(t, -1) for t in end.values()])
    cur = peak = 0
    for _, d in points:
        cur += d
        peak = max(peak, cur)
    assert peak <= 2  # the fingerprint's 2 tokens
    row = agent.service_row()
    assert (row["lifecycle"], row["running"], row["withdrawn"]) == ("manual", False, False)
    # Never started nor stopped for its jobs (what would have come before they ended; the
    # agent has no lifecycle for a manual service to stop it by later).
    assert {e["op"] for e in events(agent, "op")} == {"fingerprint"}
