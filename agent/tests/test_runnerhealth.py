"""Runner health and events (issue 15, part 6; G12): `doctor --json` at load and every
refresh, an unhealthy runner's jobs wait with the runner's own reason; `--events` passed only
to a runner whose `[runner].capabilities` lists "events", its events kept (bounded) with the
attempt. The pure parts first, then real agents (the echo test runner answers doctor from
<module data>/doctor.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent_helpers import read_jsonl, write_module

from oarbank_agent.jobs import runnerevents
from oarbank_agent.jobs.runnerhealth import judge
from oarbank_agent.operate import control

MOD = "test.agent.echo"


def _contract(health: str, checks: list | None = None, supported: list | None = None) -> dict:
    doc = {"runner_protocol": {"supported": supported or [1]}, "health": health,
           "capabilities": []}
    if checks is not None:
        doc["checks"] = checks
    return doc


def test_what_a_doctor_said_in_the_contracts_form() -> None:
    assert judge(0, _contract("healthy", [{"name": "python", "ok": True}]), "") == (
        "healthy", None)
    assert judge(0, _contract("unhealthy", [
        {"name": "python", "ok": True}, {"name": "weights", "ok": False, "detail": "/m gone"},
        {"name": "disk", "ok": False}]), "") == ("unhealthy", "weights: /m gone; disk")
    assert judge(0, _contract("undetected", [
        {"name": "gpu", "ok": False, "detail": "no NVIDIA driver"}]), "") == (
        "undetected", "gpu: no NVIDIA driver")
    assert judge(0, _contract("unhealthy"), "") == (
        "unhealthy", "its doctor --json says unhealthy and names no failed check")
    # the contract says exit 0 even when unhealthy: a non-zero exit is a broken doctor
    assert judge(1, _contract("healthy"), "") == (
        "unhealthy", "doctor --json said healthy (exit 1)")
    # a runner protocol this agent does not speak: this node cannot run it
    assert judge(0, _contract("healthy", supported=[2]), "") == (
        "undetected", "its doctor supports runner protocol [2]; this agent speaks 1")


def test_a_long_check_detail_never_hides_the_next_failed_check() -> None:
    # a node without any GPU runtime: each probe's dlopen error runs long (CI's fresh machine)
    long = "libcuda.so.1: cannot open shared object file: No such file or directory; " * 5
    _, why = judge(0, _contract("undetected", [
        {"name": "gpu api cuda", "ok": False, "detail": long},
        {"name": "gpu api rocm", "ok": False, "detail": "/dev/kfd missing"},
        {"name": "gpu api opencl", "ok": False, "detail": "OpenCL not found"}]), "")
    assert "gpu api rocm: /dev/kfd missing" in why
    assert why.endswith("gpu api opencl: OpenCL not found")
    assert "\u2026; gpu api rocm" in why  # the long one is clipped, and says so
    many = [{"name": f"c{i}", "ok": False} for i in range(12)]
    _, why = judge(0, _contract("unhealthy", many), "")
    assert why.startswith("c0; c1") and why.endswith("c7; and 4 more failed checks")


def test_what_a_doctor_said() -> None:
    assert judge(0, {"ok": True, "python": "3.11"}, "") == ("healthy", None)
    assert judge(0, {"ok": False, "reason": "no_weights", "detail": "/m missing"}, "") == (
        "unhealthy", "no_weights: /m missing")
    assert judge(1, {"ok": False, "problems": ["a", "b"]}, "") == ("unhealthy", "a; b (exit 1)")
    assert judge(1, {"ok": True}, "") == ("unhealthy", 'doctor --json answered {"ok": true} '
                                                       "(exit 1)")
    health, why = judge(None, None, "Traceback\nTimeoutError: slow disk\n", 10)
    assert health == "unhealthy" and why.startswith("doctor --json did not answer within 10s")
    assert "slow disk" in why
    # a runner that does not speak doctor --json: not checked, and said so
    health, why = judge(2, None, "usage: runner.py {run}\nrunner.py: error: invalid choice\n")
    assert health == "unknown"
    assert why.startswith("doctor --json answered no JSON object with a 'health' of "
                          "healthy/unhealthy/undetected (nor the older 'ok') (exit 2)")
    assert "invalid choice" in why
    assert judge(0, {"health": "fine"}, "")[0] == "unknown"  # not one of the contract's


def test_events_are_bounded_whole_lines_and_never_followed(tmp_path: Path) -> None:
    (tmp_path / runnerevents.FILE).write_text(
        "".join(json.dumps({"i": i}) + "\n" for i in range(30)) + "not json\n[1]\n")
    assert runnerevents.collect(tmp_path) == {
        "events": [{"i": i} for i in range(10, 30)], "events_count": 30}
    line = json.dumps({"pad": "x" * 1000}) + "\n"
    n = runnerevents.FILE_MAX // len(line) + 50
    (tmp_path / runnerevents.FILE).write_text(line * n)
    got = runnerevents.collect(tmp_path)
    kept = (tmp_path / runnerevents.FILE).read_bytes()
    assert len(kept) <= runnerevents.FILE_MAX and kept.startswith(b'{"pad"')
    assert got["events_cut_bytes"] == len(line) * n - len(kept)
    assert got["events_count"] == len(kept) // len(line) and len(got["events"]) == 20
    # a link left by the runner is not followed (read nor rewritten)
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"secret": 1}) + "\n")
    (tmp_path / runnerevents.FILE).unlink()
    os.symlink(secret, tmp_path / runnerevents.FILE)
    assert runnerevents.collect(tmp_path) == {}


def test_an_unhealthy_runner_holds_its_jobs_with_its_reason_until_healthy(
        start_agent, tmp_path: Path) -> None:
    agent = start_agent([write_module(tmp_path / "m")], extra_args=["--refresh-s", "0.5"])
    sd = str(agent.state_dir)
    assert agent.status()["runners"][MOD]["health"] == "healthy"  # checked at load
    doctor = agent.module_data() / "doctor.json"
    doctor.write_text(json.dumps({"answer": {"ok": False, "reason": "weights_missing",
                                             "detail": "/models/x.bin not found"}, "exit": 1}))
    agent.wait_for(lambda: agent.status()["runners"][MOD]["health"] == "unhealthy",
                   timeout=60, what="the next refresh's doctor")
    reason = ("waiting: the runner of module test.agent.echo is unhealthy: weights_missing: "
              "/models/x.bin not found (exit 1) (its `doctor --json`, asked again every "
              "--refresh-s)")
    assert agent.status()["runners"][MOD]["reason"] == "weights_missing: /models/x.bin not " \
                                                       "found (exit 1)"
    r = agent.cli("submit", "--state-dir", sd, "--module", "echo", "--stage", "plain",
                  "--payload", "{}", "--wait", "--timeout", "3")
    assert r.returncode != 0 and reason in r.stdout + r.stderr, (r.stdout, r.stderr)
    job = next(j for j in agent.status()["jobs"])
    assert (job["state"], job["reason"]) == ("queued", reason)
    assert "test.agent.echo: runner unhealthy: weights_missing" in agent.log()
    text = agent.cli("status", "--state-dir", sd).stdout
    assert "RUNNER UNHEALTHY test.agent.echo: weights_missing: /models/x.bin not found" in text
    doctor.unlink()  # healthy again: the job runs at the next refresh
    done = agent.wait(job["job_id"], 90)
    assert (done["state"], done["reason"]) == ("succeeded", None), done


def test_events_go_to_runners_that_declare_them_and_stay_with_the_attempt(
        start_agent, tmp_path: Path) -> None:
    plain = write_module(tmp_path / "plain")
    agent = start_agent([plain, write_module(tmp_path / "ev", module_id="test.agent.ev",
                                             runner={"capabilities": ["events"]})])
    job = agent.run_job("plain", {"events": 25}, module="ev")
    assert job["state"] == "succeeded", job
    attempt = f"{job['job_id']}.1"
    assert job["events"] == {"events": [{"event": "step", "i": i, "pad": ""}
                                        for i in range(5, 25)],
                             "events_count": 25, "attempt_id": attempt}
    workdir = agent.state_dir / "jobs" / job["job_id"] / "a1"
    argv = next(r["argv"] for r in read_jsonl(workdir / "runs.jsonl") if r["event"] == "start")
    assert argv[-2:] == ["--events", str(workdir / "events.ndjson")]
    rec = json.loads((agent.state_dir / "jobs" / job["job_id"] / "job.json").read_text())
    assert rec["history"][-1]["events_count"] == 25
    # a runner that does not declare them gets no --events (it might refuse the flag)
    other = agent.run_job("plain", {"events": 3})
    assert other["state"] == "succeeded" and "events" not in other
    wd = agent.state_dir / "jobs" / other["job_id"] / "a1"
    assert "--events" not in next(r["argv"] for r in read_jsonl(wd / "runs.jsonl"))
    reply = control.request(agent.state_dir, {"op": "job", "job_id": job["job_id"]})
    assert reply["job"]["events"]["events_count"] == 25


def test_an_undetected_runner_refuses_new_jobs_with_its_reason(
        start_agent, tmp_path: Path) -> None:
    agent = start_agent([write_module(tmp_path / "m")], extra_args=["--refresh-s", "0.5"])
    sd = str(agent.state_dir)
    assert agent.status()["runners"][MOD] == {
        "health": "healthy", "reason": None,
        "checked_at": agent.status()["runners"][MOD]["checked_at"]}
    # The runner's doctor says this node cannot run it (its jobs already queued wait, held by
    # the same pseudo pool as an unhealthy runner's, above).
    doctor = agent.module_data() / "doctor.json"
    doctor.write_text(json.dumps({"answer": {
        "runner_protocol": {"supported": [1]}, "health": "undetected", "capabilities": [],
        "checks": [{"name": "gpu", "ok": False, "detail": "no NVIDIA driver on this node"}]}}))
    agent.wait_for(lambda: agent.status()["runners"][MOD]["health"] == "undetected",
                   timeout=60, what="the next refresh's doctor")
    r = agent.cli("submit", "--state-dir", sd, "--module", "echo", "--stage", "plain",
                  "--payload", "{}")
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert ("RUNNER_UNDETECTED: the runner of module test.agent.echo says this node cannot "
            "run it: gpu: no NVIDIA driver on this node (its `doctor --json`)") in r.stderr
    assert agent.status()["jobs_total"] == 0  # nothing queued
    # no alarm: the runner's own "not here" is an info line, not a warning
    line = next(ln for ln in agent.log().splitlines() if "runner undetected" in ln)
    assert "WARNING" not in line, line
    assert "RUNNER UNDETECTED test.agent.echo: gpu: no NVIDIA driver" in agent.cli(
        "status", "--state-dir", sd).stdout
    doctor.unlink()  # detected again: jobs are taken
    agent.wait_for(lambda: agent.status()["runners"][MOD]["health"] == "healthy", timeout=60,
                   what="the doctor healthy again")
    assert agent.run_job("plain", {})["state"] == "succeeded"
