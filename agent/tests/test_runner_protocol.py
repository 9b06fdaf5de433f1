"""The runner protocol through a real agent: environment, connectors, exit codes, retries,
timeouts (contract section 4)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from agent_helpers import read_jsonl, write_module

BASE_ENV = {"OARBANK_WORKDIR", "OARBANK_TMP", "TMPDIR", "OARBANK_MODULE_DATA", "OARBANK_PLATFORM",
            "OARBANK_MODULE", "OARBANK_ATTEMPT_ID", "OARBANK_PROTOCOL", "OARBANK_SETTINGS_FILE",
            "PYTHONUTF8", "HOME"}


def test_environment_is_exactly_the_contracts(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    plain = agent.run_job("plain", {"env": True})
    assert plain["state"] == "succeeded", plain
    env = plain["result"]["payload"]["env"]
    # A stage that reserves no pool of the service gets no connector.
    assert "OARBANK_SERVICE_ECHO" not in env
    assert set(env) == BASE_ENV
    spec = plain["result"]["payload"]["spec"]
    w = Path(env["OARBANK_WORKDIR"])
    assert env["OARBANK_TMP"] == env["TMPDIR"] == str(w / "tmp")
    assert env["HOME"].startswith(str(w))
    assert env["OARBANK_ATTEMPT_ID"] == spec["attempt_id"] == f"{plain['job_id']}.1"
    assert env["OARBANK_PROTOCOL"] == "1" and env["PYTHONUTF8"] == "1"
    assert env["OARBANK_MODULE"] == "test.agent.echo"
    assert env["OARBANK_PLATFORM"].startswith("linux-")
    assert env["OARBANK_MODULE_DATA"] == str(agent.module_data())
    assert spec == {"job_id": plain["job_id"], "attempt_id": spec["attempt_id"], "stage": "plain",
                    "payload": {"env": True}}

    served = agent.run_job("echo", {"env": True, "requests": 2})
    assert served["state"] == "succeeded", served
    env = served["result"]["payload"]["env"]
    assert set(env) == BASE_ENV | {"OARBANK_SERVICE_ECHO", "OARBANK_POOL_ECHO_TOKENS"}
    assert env["OARBANK_SERVICE_ECHO"].startswith("fd:")
    assert env["OARBANK_POOL_ECHO_TOKENS"] == "1"
    runs = [r for r in read_jsonl(agent.module_data() / "runs.jsonl") if r["event"] == "start"]
    assert all(r["cwd"].startswith(str(agent.state_dir / "jobs")) for r in runs)


def test_op_environment_is_exactly_the_contracts(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    assert agent.run_job("echo", {"requests": 1})["state"] == "succeeded"
    ops = [e for e in read_jsonl(agent.module_data() / "events.jsonl") if e["event"] == "op"]
    base = {"OARBANK_MODULE_DATA", "OARBANK_MODULE", "OARBANK_SERVICE", "OARBANK_NODE_ID",
            "OARBANK_PLATFORM", "OARBANK_SETTINGS_FILE", "OARBANK_LIMITS_FILE",
            "OARBANK_TOOLS_FILE", "HOME", "TMPDIR"}
    seen = {e["op"] for e in ops}
    assert {"fingerprint", "start", "ready"} <= seen
    for e in ops:
        # Python adds LC_CTYPE under the C locale itself (PEP 538); nothing else may appear.
        keys = set(e["env"]) - {"LC_CTYPE"}
        # echo is an endpoint service: every op of it hears the features the agent offers.
        expected = base | {"OARBANK_ENDPOINT_FEATURES"} | (
            {"OARBANK_ENDPOINT_CHANNEL"} if e["op"] == "start" else set())
        assert keys == expected, e["op"]
        assert e["features"] == "ready"


def test_exit_codes_map_to_job_outcomes(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module])
    job2 = agent.run_job("plain", {"exit": 2})
    assert (job2["state"], job2["exit_code"], job2["attempts"]) == ("failed", 2, 1)
    assert job2["reason"].startswith("told_to_exit_2")
    job3 = agent.run_job("plain", {"exit": 3})
    assert (job3["state"], job3["exit_code"], job3["attempts"]) == ("failed", 3, 1)
    # 2, 3 and 75 count only with failure.json: otherwise a plain failure, not retried.
    bare = agent.run_job("plain", {"exit": 75, "failure": False})
    assert (bare["state"], bare["exit_code"], bare["attempts"]) == ("failed", 75, 1)
    assert "failure.json" in bare["reason"]
    other = agent.run_job("plain", {"exit": 9})
    assert (other["state"], other["exit_code"]) == ("failed", 9)
    assert set(job2) == {"job_id", "module", "stage", "state", "attempts", "exit_code", "reason",
                         "result"}


def test_transient_exit_is_retried_up_to_max_attempts(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", stages=[
        {"name": "plain", "timeout_s": 60, "retry": {"max_attempts": 3}},
        {"name": "once_more", "timeout_s": 60, "retry": {"max_attempts": 2}}])
    agent = start_agent([mod])
    ok = agent.run_job("plain", {"exit": 75, "exit_below_attempt": 3})
    assert (ok["state"], ok["attempts"], ok["exit_code"]) == ("succeeded", 3, 0), ok
    gave_up = agent.run_job("once_more", {"exit": 75})
    assert (gave_up["state"], gave_up["attempts"], gave_up["exit_code"]) == ("failed", 2, 75)
    assert "gave up after 2 attempts" in gave_up["reason"]
    attempts = [r["attempt"] for r in read_jsonl(agent.module_data() / "runs.jsonl")
                if r["event"] == "start"]
    assert attempts == [f"{ok['job_id']}.{n}" for n in (1, 2, 3)] + \
        [f"{gave_up['job_id']}.{n}" for n in (1, 2)]


def test_timeout_terminates_the_runner_group(start_agent, tmp_path: Path) -> None:
    # timeout_s leaves a runner started under load the time to install its SIGTERM handler:
    # killed before that, the stubborn one would die of the TERM (-15), not the KILL.
    mod = write_module(tmp_path / "m", stages=[{"name": "plain", "timeout_s": 2.5}],
                       runner={"stop_grace_s": 0.3})
    agent = start_agent([mod])
    polite = agent.run_job("plain", {"sleep_s": 30})
    assert polite["state"] == "failed" and polite["reason"].startswith("timeout"), polite
    assert polite["attempts"] == 1
    stubborn = agent.run_job("plain", {"sleep_s": 30, "ignore_term": True})
    assert stubborn["state"] == "failed" and stubborn["exit_code"] == -9, stubborn
    # The runner's group is gone at attempt end (the agent fixture also checks nothing is
    # left). Only runner records count: a periodic op (refresh, list_owned) may be running.
    left = []
    for rec in (agent.state_dir / "procs").glob("*.json"):
        with contextlib.suppress(FileNotFoundError):  # an op's record may go as we read
            left.append(json.loads(rec.read_text()))
    assert not [r for r in left if r["kind"] == "runner"], left
