"""The command line as a user runs it: run, submit, status, demo."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from agent_helpers import processes_referencing, read_jsonl, write_module

from oarbank_agent.operate import control


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_invalid_manifest_is_refused_naming_the_key_others_run(start_agent, tmp_path: Path,
                                                               echo_module: Path) -> None:
    bad = write_module(tmp_path / "bad", module_id="test.agent.bad",
                       service={"provides": {"pools": []}},
                       stages=[{"name": "plain", "timeout_s": 5}])
    agent = start_agent([bad, echo_module])
    log = agent.log()
    assert f"{bad / 'oarbank-module.toml'}: INVALID" in log
    assert "services[0]" in log  # the checker's line names the key
    assert agent.run_job("plain", {})["state"] == "succeeded"
    assert [r["module"] for r in agent.status()["services"]] == ["test.agent.echo"]


def test_submit_and_wait_print_the_job_record(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    sd = str(agent.state_dir)
    sock = agent.state_dir / "control.sock"
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    r = cli("submit", "--state-dir", sd, "--module", "echo", "--stage", "plain",
            "--payload", "{}")
    assert r.returncode == 0 and r.stdout.strip().startswith("j"), r
    r = cli("submit", "--state-dir", sd, "--module", "test.agent.echo", "--stage", "plain",
            "--payload", '{"x": 1}', "--wait")
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert set(rec) == {"job_id", "module", "stage", "state", "attempts", "exit_code", "reason",
                        "result"}
    assert (rec["state"], rec["module"], rec["stage"]) == ("succeeded", "test.agent.echo", "plain")
    assert rec["result"]["envelope"] == 1
    failed = cli("submit", "--state-dir", sd, "--module", "echo", "--stage", "plain",
                 "--payload", '{"exit": 2}', "--wait")
    assert failed.returncode == 1 and json.loads(failed.stdout)["state"] == "failed"


def test_bad_submissions_exit_2_and_queue_nothing(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    sd = str(agent.state_dir)
    cases = [("echo", "plain", "{not json", "not valid JSON"),
             ("echo", "plain", "[1, 2]", "must be a JSON object"),
             ("nosuch", "plain", "{}", "unknown module 'nosuch'"),
             ("echo", "nosuch", "{}", "has no stage 'nosuch'")]
    for module, stage, payload, message in cases:
        r = cli("submit", "--state-dir", sd, "--module", module, "--stage", stage,
                "--payload", payload)
        assert r.returncode == 2, (payload, r)
        assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stdout == ""
    assert agent.status()["jobs"] == []
    assert not [p for p in (agent.state_dir / "jobs").iterdir()]


def test_submit_without_an_agent_is_a_clear_error(tmp_path: Path) -> None:
    r = cli("submit", "--state-dir", str(tmp_path), "--module", "echo", "--stage", "plain",
            "--payload", "{}")
    assert r.returncode == 1 and "no agent is running" in r.stderr
    r = cli("status", "--state-dir", str(tmp_path))
    assert r.returncode == 1 and "no agent is running" in r.stderr


def test_wait_timeout_says_so(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    r = cli("submit", "--state-dir", str(agent.state_dir), "--module", "echo", "--stage",
            "plain", "--payload", '{"sleep_s": 1.5}', "--wait", "--timeout", "0.2")
    assert r.returncode == 1 and "timed out after 0.2s" in r.stderr, r


def test_status_shows_services_and_jobs(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    job = agent.run_job("echo", {"requests": 1})
    r = cli("status", "--state-dir", str(agent.state_dir), "--json")
    assert r.returncode == 0
    st = json.loads(r.stdout)
    assert st["node_id"] == "test-node" and st["hostname"]
    assert isinstance(st["time"], float)
    (row,) = st["services"]
    # The contract's row (section 6, also each heartbeat row) with this project's addition
    # (docs/contract.md 6.2a), and what status adds for an operator (runtime.details).
    assert set(row) == {"module", "service", "health", "running", "ready", "accepting", "error",
                        "held", "disabled", "withdrawn", "gpu_api_missing", "lifecycle", "users",
                        "endpoint"} | {"evicted_for"} | {"pid", "pgid", "uptime_s",
                                                         "idle_stop_in_s", "last_stop_reason",
                                                         "starts", "restarts", "idle_timeout_s"} \
        | {"rss_bytes", "loads", "gpu_mem_bytes"}
    assert row["pid"] > 0 and row["uptime_s"] >= 0 and row["starts"] == 1
    # What the portal's node_metrics reads: the running service's resident memory, its loads.
    assert row["rss_bytes"] > 0 and row["loads"] == 1
    assert (row["module"], row["service"], row["health"], row["ready"], row["endpoint"],
            row["lifecycle"], row["users"]) == ("test.agent.echo", "echo", "healthy", True, True,
                                                "on_demand", 0)
    assert [(j["job_id"], j["state"]) for j in st["jobs"]] == [(job["job_id"], "succeeded")]
    human = cli("status", "--state-dir", str(agent.state_dir))
    assert human.returncode == 0
    assert "node test-node" in human.stdout and job["job_id"] in human.stdout
    assert "on_demand" in human.stdout


def test_agent_stops_cleanly_and_jobs_survive_on_disk(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    done = agent.run_job("plain", {})
    running = agent.submit("plain", {"sleep_s": 30})
    agent.wait_for(lambda: any(j["state"] == "running" for j in agent.status()["jobs"]),
                   what="the job to run")
    agent.stop()  # asserts exit 0, no process left, no group record left
    records = {p.parent.name: json.loads(p.read_text())
               for p in (agent.state_dir / "jobs").glob("*/job.json")}
    assert records[done["job_id"]]["state"] == "succeeded"
    assert records[running]["state"] == "queued"  # never lost: a restarted agent resumes it


def test_demo_runs_the_example(tmp_path: Path) -> None:
    r = cli("demo", "--jobs", "3", "--load-s", "0.2", "--json", timeout=180)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"jobs", "succeeded", "model_loads", "service_pids", "wall_s"}
    assert (out["jobs"], out["succeeded"], out["model_loads"]) == (3, 3, 1)
    assert len(out["service_pids"]) == 1
    assert "jobs done: 3/3" in r.stderr


def test_restarted_agent_ends_leftovers_and_resumes_jobs(start_agent, echo_module: Path) -> None:
    # linger_after_eof: a daemon that outlives its channel, so the restart has a group to end.
    first = start_agent([echo_module], {"echo": {"linger_after_eof": True}})
    job = first.submit("echo", {"requests": 1, "sleep_s": 60, "sleep_below_attempt": 2})
    first.wait_for(lambda: any(r["event"] == "sleep"
                               for r in read_jsonl(first.module_data() / "runs.jsonl")),
                   what="the runner to be past its requests")
    first.kill()
    # The runner dies with the crashed agent (its watcher kills it: platform/posix/tether.py);
    # the service's daemon does not.
    first.wait_for(lambda: not any("echo_runner.py run" in p
                                   for p in processes_referencing(first.state_dir)),
                   timeout=5, what="the runner to die with its agent")
    recs = sorted(p.name for p in (first.state_dir / "procs").glob("*.json"))
    assert recs, "the crashed agent's group records are the restart's to-do list"
    second = start_agent([echo_module], state_dir=first.state_dir)
    rec = second.wait(job)
    # The interrupted attempt is given back (released, not charged); its number is not reused.
    assert (rec["state"], rec["attempts"]) == ("succeeded", 1), rec
    on_disk = json.loads((second.state_dir / "jobs" / job / "job.json").read_text())
    assert on_disk["released"] == 1 and on_disk["history"][0]["outcome"] == "released"
    hellos = [e["pid"] for e in read_jsonl(second.module_data() / "events.jsonl")
              if e["event"] == "hello"]
    assert len(set(hellos)) == 2  # the endpoint service was not adopted: a new daemon
    assert "ended a process group left by a previous agent" in second.log(), recs


def test_a_wait_outlasts_the_control_connections_own_timeout(start_agent, echo_module: Path) -> None:
    # Regression: `submit --wait` connected with a 30 s timeout and its wait kept it, so any job
    # longer than 30 s ended the command with "lost the agent". Same mechanism, scaled down: a
    # client whose connection times out after 0.5 s waits 2 s for a job when told to wait.
    agent = start_agent([echo_module])
    job_id = agent.submit("plain", {"sleep_s": 2.0})
    with control.Client(agent.state_dir, timeout=0.5) as c:
        reply = c.call({"op": "wait", "job_id": job_id}, timeout=None)
    assert reply["ok"] and reply["job"]["state"] == "succeeded", reply
