"""`oarbank-agent module remove ID [--now] [--wait]` (issue 15, part 3, G9 with G6): new jobs
refused at once, queued ones failed with the reason, running attempts finish (or `--now`
releases them, and they fail too), the services stopped, every owned object destroyed with
`--force`, the module forgotten, also across a restart, until `module add` loads it again.
Real agents, the echo test module (its service lists <data>/owned.json)."""

from __future__ import annotations

import json
from pathlib import Path

from agent_helpers import read_jsonl, write_module

from oarbank_agent.operate import control

MOD = "test.agent.echo"
FAILED = (f"module_removed: module {MOD} was removed from this node (oarbank-agent module "
          "remove) before this job could run")


def _submit(agent, stage: str = "echo") -> dict:
    return control.request(agent.state_dir, {"op": "submit", "module": "echo", "stage": stage,
                                             "payload": {}})


def test_remove_lets_attempts_finish_fails_queued_jobs_destroys_owned_and_forgets(
        start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    agent = start_agent([mod], {"echo": {"slots": 1}})
    sd = str(agent.state_dir)
    data = agent.module_data()
    # objects the periodic reaper leaves alone (no attempt, an attempt never given); removal
    # destroys every one with an id
    data.mkdir(parents=True, exist_ok=True)
    (data / "owned.json").write_text(json.dumps([{"id": "vol-a", "attempt": 10**6},
                                                 {"id": "lease-b"}, {"kind": "nameless"}]))
    # the attempt runs until the test creates <data>/go: the removal cannot end before that
    running = agent.submit("echo", {"requests": 1, "wait_file": "go"})
    agent.wait_for(lambda: any(r["event"] == "waiting"
                               for r in read_jsonl(data / "runs.jsonl")),
                   timeout=60, what="a running job")
    queued = agent.submit("echo", {"requests": 1})  # waits for the one slot
    assert next(j for j in agent.status()["jobs"] if j["job_id"] == queued)["state"] == "queued"

    r = agent.cli("module", "remove", "--state-dir", sd, "echo")
    assert r.returncode == 0, r.stderr
    assert f"failed (module removed): {queued}" in r.stdout
    assert f"{MOD}  removing:" in r.stdout and f"{MOD}  removing  services: echo" in r.stdout
    # refused at once, with the reason; the queued job failed with it
    reply = _submit(agent, "plain")
    assert reply["code"] == "module_removed" and "is being removed" in reply["error"], reply
    done = agent.wait(queued, 30)
    assert (done["state"], done["reason"], done["attempts"]) == ("failed", FAILED, 0), done
    r = agent.cli("module", "disable", "--state-dir", sd, "echo")
    assert r.returncode == 1 and "is being removed" in r.stderr, r
    assert agent.service_row()["running"] is True  # its attempt still uses it
    (data / "go").touch()
    # the running attempt finishes
    first = agent.wait(running, 90)
    assert (first["state"], first["attempts"]) == ("succeeded", 1), first

    agent.wait_for(lambda: not agent.status()["services"], timeout=90, what="module forgotten")
    listed = json.loads(agent.cli("module", "list", "--state-dir", sd, "--json").stdout)
    assert listed["modules"] == []
    events = read_jsonl(data / "events.jsonl")
    ops = [e["op"] for e in events if e["event"] == "op"]
    stop_at = max(i for i, o in enumerate(ops) if o == "stop")
    assert "list_owned" in ops[stop_at:], ops  # its objects listed after its stop
    destroyed = [(e["id"], e["force"]) for e in events if e["event"] == "destroy"]
    assert sorted(destroyed) == [("lease-b", True), ("vol-a", True)]
    assert json.loads((data / "owned.json").read_text()) == [{"kind": "nameless"}]
    assert "1 owned object(s) without an 'id' left alone" in agent.log()
    gone = (f"module {MOD} was removed from this node (oarbank-agent module remove); "
            f"`oarbank-agent module add {mod}` loads it again")
    assert _submit(agent) == {"ok": False, "code": "unknown_module", "error": gone}
    assert json.loads((agent.state_dir / "modules.json").read_text()) == {
        "disabled": [], "added": [], "removed": [MOD]}
    agent.stop()

    # a restart whose command line still names the folder does not bring it back
    again = start_agent([mod], state_dir=agent.state_dir)
    assert again.status()["services"] == [] and again.status()["modules_refused"] == {}
    assert _submit(again)["error"] == gone
    assert f"not loaded: {gone}" in again.log()
    # ... `module add` does, and it runs jobs again
    r = again.cli("module", "add", "--state-dir", sd, str(mod))
    assert r.returncode == 0 and f"{MOD}  enabled  services: echo" in r.stdout, r.stderr
    assert again.run_job("echo", {"requests": 1})["state"] == "succeeded"
    assert json.loads((again.state_dir / "modules.json").read_text())["removed"] == []


def test_remove_now_releases_running_attempts_and_fails_them(start_agent,
                                                             tmp_path: Path) -> None:
    agent = start_agent([write_module(tmp_path / "m")])
    sd = str(agent.state_dir)
    job = agent.submit("echo", {"requests": 1, "sleep_s": 120})
    plain = agent.submit("plain", {"sleep_s": 120})  # a stage that uses no service
    agent.wait_for(lambda: sum(j["state"] == "running" for j in agent.status()["jobs"]) == 2,
                   timeout=60, what="two running jobs")
    r = agent.cli("module", "remove", "--state-dir", sd, "echo", "--now", "--wait")
    assert r.returncode == 0, r.stderr
    assert f"{MOD}  removed" in r.stdout
    for job_id in (job, plain):
        rec = json.loads((agent.state_dir / "jobs" / job_id / "job.json").read_text())
        assert (rec["state"], rec["reason"], rec["attempts"], rec["released"]) == (
            "failed", FAILED, 0, 1), rec
        assert rec["history"][-1]["reason"] == f"module {MOD} removed (--now)"
    assert agent.status()["services"] == []
    assert agent.cli("module", "remove", "--state-dir", sd, MOD).returncode == 2
