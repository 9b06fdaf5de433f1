"""Modules at run time (issue 15, part 3, G9): `oarbank-agent module list | disable | enable`
on a running agent. Disable stops the module's services once their attempts are over (reason
`disabled`), refuses its jobs with the reason, and survives a restart; `--now` releases the
running attempts (not charged). The lifecycle rules first (pure), then real agents."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_helpers import write_module

from oarbank_agent.operate import control
from oarbank_agent.services import lifecycle as lc

MOD = "test.agent.echo"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", *args], capture_output=True,
                          text=True, timeout=120)


def _st(state: lc.State, users: int = 0, lifecycle: str = "on_demand") -> lc.ServiceState:
    return lc.set_disabled(lc.ServiceState(lifecycle, 30, 1, 10, 5, state=state, users=users),
                           True)


def test_a_disabled_service_is_never_started_and_stops_once_unused() -> None:
    assert lc.decide(_st(lc.State.STOPPED, users=2), 0).action == "none"  # wanted, not started
    assert lc.decide(_st(lc.State.STOPPED, lifecycle="always"), 0).action == "none"
    assert lc.decide(_st(lc.State.READY, users=1), 0).action == "none"  # its attempts finish
    assert lc.decide(_st(lc.State.READY), 0) == lc.Decision("stop", reason="disabled")
    assert lc.decide(_st(lc.State.STARTING, users=1), 0) == lc.Decision("cancel",
                                                                         reason="disabled")
    assert not lc.offered(_st(lc.State.READY)) and lc.hopeless(_st(lc.State.STOPPED))
    enabled = lc.set_disabled(_st(lc.State.STOPPED, users=1), False)
    assert lc.decide(enabled, 0).action == "start"


def test_disable_lets_attempts_finish_refuses_jobs_and_survives_a_restart(
        start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    agent = start_agent([mod])
    sd = str(agent.state_dir)
    running = agent.submit("echo", {"requests": 1, "sleep_s": 3})
    agent.wait_for(lambda: any(j["state"] == "running" for j in agent.status()["jobs"]),
                   timeout=60, what="a running job")
    r = cli("module", "disable", "--state-dir", sd, "echo")
    assert r.returncode == 0, r.stderr
    assert f"{MOD}  disabled  services: echo" in r.stdout
    row = agent.service_row()
    assert row["disabled"] is True and row["running"] is True  # its attempt still runs
    refusal = (f"module {MOD} is disabled on this node: `oarbank-agent module enable {MOD}` "
               "enables it")
    r = cli("submit", "--state-dir", sd, "--module", "echo", "--stage", "plain",
            "--payload", "{}")
    assert r.returncode == 2 and refusal in r.stderr, r.stderr
    reply = control.request(agent.state_dir, {"op": "submit", "module": MOD, "stage": "echo",
                                              "payload": {}})
    assert (reply["code"], reply["error"]) == ("module_disabled", refusal)
    done = agent.wait(running, 90)
    assert (done["state"], done["attempts"]) == ("succeeded", 1), done
    agent.wait_for(lambda: not agent.service_row()["running"], timeout=60, what="stopped")
    assert agent.service_row()["last_stop_reason"] == "disabled"
    assert json.loads((agent.state_dir / "modules.json").read_text()) == {
        "disabled": [MOD], "added": [], "removed": []}
    agent.stop()
    # a restart keeps it disabled: never started, jobs refused
    again = start_agent([mod], state_dir=agent.state_dir)
    assert again.service_row()["disabled"] is True
    assert control.request(again.state_dir, {"op": "submit", "module": "echo",
                                             "stage": "plain", "payload": {}})["code"] \
        == "module_disabled"
    listed = json.loads(cli("module", "list", "--state-dir", sd, "--json").stdout)
    assert [(m["id"], m["state"]) for m in listed["modules"]] == [(MOD, "disabled")]
    r = cli("module", "enable", "--state-dir", sd, MOD)
    assert r.returncode == 0 and f"{MOD}  enabled" in r.stdout, r
    assert again.service_row()["disabled"] is False
    assert again.run_job("echo", {"requests": 1})["state"] == "succeeded"


def test_disable_now_releases_running_attempts_uncharged(start_agent, tmp_path: Path) -> None:
    agent = start_agent([write_module(tmp_path / "m")])
    sd = str(agent.state_dir)
    job = agent.submit("echo", {"requests": 1, "sleep_s": 60, "sleep_below_attempt": 2})
    agent.wait_for(lambda: any(j["state"] == "running" for j in agent.status()["jobs"]),
                   timeout=60, what="a running job")
    assert cli("module", "disable", "--state-dir", sd, "echo", "--now").returncode == 0
    agent.wait_for(lambda: agent.status()["jobs"][0]["state"] == "queued", timeout=60,
                   what="the job released")
    rec = json.loads((agent.state_dir / "jobs" / job / "job.json").read_text())
    assert (rec["attempts"], rec["released"]) == (0, 1), rec
    assert rec["history"][-1]["reason"] == f"module {MOD} disabled (--now)"
    agent.wait_for(lambda: not agent.service_row()["running"], timeout=60, what="stopped")
    assert cli("module", "enable", "--state-dir", sd, "echo").returncode == 0
    done = agent.wait(job, 90)  # attempt 2 (numbers are never reused) does not sleep
    assert (done["state"], done["attempts"]) == ("succeeded", 1), done


def test_module_commands_name_what_is_wrong(start_agent, tmp_path: Path) -> None:
    agent = start_agent([write_module(tmp_path / "m")])
    r = cli("module", "disable", "--state-dir", str(agent.state_dir), "nope")
    assert r.returncode == 2
    assert f"unknown module 'nope' (loaded: {MOD})" in r.stderr
    reply = control.request(agent.state_dir, {"op": "module", "action": "explode"})
    assert reply["code"] == "bad_request" and "unknown action 'explode'" in reply["error"]


def test_a_module_added_at_run_time_runs_and_stays_after_a_restart(start_agent,
                                                                   tmp_path: Path) -> None:
    agent = start_agent([write_module(tmp_path / "m")])
    sd = str(agent.state_dir)
    extra = write_module(tmp_path / "extra", module_id="test.agent.extra")
    r = cli("module", "add", "--state-dir", sd, str(extra))
    assert r.returncode == 0, r.stderr
    assert f"test.agent.extra  enabled  services: echo  {extra}" in r.stdout
    assert agent.run_job("echo", {"requests": 1}, module="extra")["state"] == "succeeded"
    # again: already loaded; a module this node cannot run: refused with the reason
    r = cli("module", "add", "--state-dir", sd, str(extra))
    assert r.returncode == 2 and f"module add: {extra} is already loaded" in r.stderr
    netmod = write_module(tmp_path / "net", module_id="test.agent.net",
                          extra='\n[sandbox]\nnet = "host"\n')
    r = cli("module", "add", "--state-dir", sd, str(netmod))
    assert r.returncode == 2 and "cannot run on this node: [sandbox].net" in r.stderr, r.stderr
    assert json.loads((agent.state_dir / "modules.json").read_text())["added"] == [str(extra)]
    agent.stop()
    again = start_agent([write_module(tmp_path / "m")], state_dir=agent.state_dir)
    assert again.run_job("echo", {"requests": 1}, module="extra")["state"] == "succeeded"
