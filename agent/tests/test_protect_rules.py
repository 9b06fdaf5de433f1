"""Host rules through ``oarbank-agent protect``: forbidding GPU work stops the GPU service with
``preempt_protection`` and requeues its job until GPU work is allowed again; an eviction holds
every yieldable service (never a non-yieldable one) until it is ended.

No GPU exists here: the host's APIs come from ``--gpu-apis`` (the operator override)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agent_helpers import read_jsonl, write_module
from test_gpu_placement import gpu_module


def protect(agent, *flags: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "oarbank_agent", "protect", "--state-dir",
                        str(agent.state_dir), *flags], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_forbid_gpu_preempts_the_gpu_service_and_requeues_its_job(start_agent,
                                                                  tmp_path: Path) -> None:
    agent = start_agent([gpu_module(tmp_path / "m")], extra_args=["--gpu-apis", "cuda"])
    job = agent.submit("echo", {"requests": 1, "sleep_s": 60, "sleep_below_attempt": 2})
    agent.wait_for(lambda: agent.status()["jobs"][0]["state"] == "running"
                   and any(r["event"] == "sleep"
                           for r in read_jsonl(agent.module_data() / "runs.jsonl")),
                   what="the GPU job running")
    out = protect(agent, "--forbid-gpu")
    assert out["rules"] == {"gpu_forbidden": True, "evicted": False}
    agent.wait_for(lambda: not agent.service_row()["running"], what="the GPU service stopped")
    row = agent.service_row()
    assert row["held"] == "preempt_protection" and row["users"] == 0, row
    j = agent.status()["jobs"][0]
    assert j["state"] == "queued" and j["released"] == 1 and j["attempts"] == 0, j
    # Still held while the rule stands: a new GPU job waits too, with a readable reason.
    other = agent.submit("echo", {"requests": 1})
    agent.wait_for(lambda: all(x["reason"] for x in agent.status()["jobs"]), what="reasons")
    jobs = agent.status()["jobs"]
    assert [x["state"] for x in jobs] == ["queued", "queued"], jobs
    assert agent.service_row()["running"] is False
    protect(agent, "--allow-gpu")
    done = [agent.wait(job), agent.wait(other)]
    assert [d["state"] for d in done] == ["succeeded", "succeeded"], done
    assert done[0]["attempts"] == 1
    assert agent.service_row()["held"] is None
    history = json.loads((agent.state_dir / "jobs" / job / "job.json").read_text())["history"]
    assert [(h["outcome"], h["reason"]) for h in history] == [
        ("released", "preempt_protection"), ("succeeded", None)]
    assert [h["attempt_id"] for h in history] == [f"{job}.1", f"{job}.2"]  # never reused


def test_evict_holds_every_yieldable_service_until_ended(start_agent, tmp_path: Path) -> None:
    yielding = write_module(tmp_path / "y", service={"lifecycle": "always"})
    keep = write_module(tmp_path / "k", module_id="test.agent.keep",
                        service={"lifecycle": "always", "yieldable": False})
    agent = start_agent([yielding, keep], extra_args=["--gpu-apis", "none"])

    def row(module: str) -> dict:
        return next(r for r in agent.status()["services"] if r["module"] == module)

    agent.wait_for(lambda: row("test.agent.echo")["ready"] and row("test.agent.keep")["ready"],
                   what="both ready")
    out = protect(agent, "--evict")
    assert out["rules"]["evicted"] is True
    agent.wait_for(lambda: not row("test.agent.echo")["running"], what="evicted")
    assert row("test.agent.echo")["held"] == "preempt_protection"
    assert row("test.agent.keep")["ready"] is True and row("test.agent.keep")["held"] is None
    assert protect(agent)["held"] == {"test.agent.echo/echo": "preempt_protection"}
    protect(agent, "--end-evict")
    agent.wait_for(lambda: row("test.agent.echo")["ready"], what="back after the eviction")
    assert row("test.agent.echo")["held"] is None


def test_protect_without_an_agent_says_so(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "oarbank_agent", "protect", "--state-dir",
                        str(tmp_path), "--evict"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no agent is running" in r.stderr


def test_host_rules_are_kept_across_a_restart(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "y", service={"lifecycle": "always"})
    agent = start_agent([mod], extra_args=["--gpu-apis", "none"])
    agent.wait_for(lambda: agent.service_row()["ready"], what="ready")
    protect(agent, "--evict")
    protect(agent, "--forbid-gpu")
    assert json.loads((agent.state_dir / "host_rules.json").read_text()) == {
        "gpu_forbidden": True, "evicted": True}
    agent.stop()
    again = start_agent([mod], state_dir=agent.state_dir, extra_args=["--gpu-apis", "none"])
    # the always service is not started again: the eviction holds from the start
    out = protect(again)
    assert out["rules"] == {"gpu_forbidden": True, "evicted": True}
    assert out["held"] == {"test.agent.echo/echo": "preempt_protection"}
    row = again.service_row()
    assert (row["running"], row["held"]) == (False, "preempt_protection")
    assert "host rule evict kept from before the restart" in again.log()
    protect(again, "--end-evict")
    again.wait_for(lambda: again.service_row()["ready"], what="back after the eviction")
    assert json.loads((again.state_dir / "host_rules.json").read_text())["evicted"] is False


def test_an_unreadable_host_rules_file_is_named_and_sets_nothing(start_agent,
                                                                  tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "host_rules.json").write_text("{not json")
    agent = start_agent([write_module(tmp_path / "m")], state_dir=state)
    assert protect(agent)["rules"] == {"gpu_forbidden": False, "evicted": False}
    assert f"{state / 'host_rules.json'}: unreadable" in agent.log()
