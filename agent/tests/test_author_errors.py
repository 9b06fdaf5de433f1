"""A module author's mistakes, met on a real agent: each error names the fix, in the words
``oarbank-sdk conform`` uses (``oarbank_sdk.advice``). Real agents, real modules (copies of
the reference example, edited the way a first change goes wrong), no mocks."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from agent_helpers import EXAMPLE, write_module

from oarbank_agent.operate import control
from oarbank_sdk import advice


def example_copy(root: Path, edit: tuple[str, str] | None = None) -> Path:
    dst = root / "modelserver"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    if edit is not None:
        svc = dst / "model_service.py"
        text = svc.read_text()
        assert edit[0] in text
        svc.write_text(text.replace(edit[0], edit[1]))
    return dst


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_a_start_that_does_not_pass_the_channel_quotes_the_daemons_last_line(start_agent,
                                                                             tmp_path):
    module = example_copy(tmp_path, ("        **ep.inherit_channel(),\n", ""))
    agent = start_agent([module], {"modelserver": {"load_s": 0}})
    job = agent.submit("generate", {"prompts": ["hi"]}, module="modelserver")
    agent.wait_for(lambda: (agent.service_row("model").get("error") or "").startswith(
        advice.CHANNEL_CLOSED), timeout=60, what="the start to fail")
    error = agent.service_row("model")["error"]
    assert error.startswith(advice.closed_before_hello(
        advice.channel_closed("end of file"), False, None)), error
    assert advice.INHERIT_FIX in error
    # the daemon's own last line (Acceptor() found its channel variable naming a descriptor it
    # does not hold), captured by the agent
    assert re.search(r"; the service's last log line: \S*EndpointError: bad_endpoint: "
                     r"OARBANK_ENDPOINT_CHANNEL=", error), error
    assert "closed its channel: the service closed" not in agent.log()  # never said twice
    reply = control.request(agent.state_dir, {"op": "job", "job_id": job})
    assert reply["job"]["state"] in ("admitted", "queued")


def test_no_hello_names_the_acceptor_and_the_job_says_it_waits_on_a_start(start_agent,
                                                                          tmp_path):
    module = write_module(tmp_path / "mod", service={
        "start_timeout_s": 8, "restart": {"backoff_initial_s": 30, "backoff_max_s": 30}})
    agent = start_agent([module], {"echo": {"no_hello": True}})
    job = agent.submit("echo", {"x": 1})

    def reason() -> str:
        return next(j for j in agent.status()["jobs"] if j["job_id"] == job)["reason"] or ""

    agent.wait_for(lambda: reason().startswith("waiting: service test.agent.echo/echo is "
                                               "starting: "), timeout=30, what="the wait")
    assert re.fullmatch(r"waiting: service test\.agent\.echo/echo is starting: \d+ s of its "
                        r"start_timeout_s 8 s \(no hello yet\)", reason()), reason()
    # `submit --wait --timeout` says the same when it gives up (on a loaded machine the 8 s
    # may have run out by then: the reason is then the failed start's, below)
    r = cli("submit", "--state-dir", str(agent.state_dir), "--module", "echo", "--stage",
            "echo", "--payload", "{}", "--wait", "--timeout", "1")
    assert r.returncode == 1
    assert re.search(r"state: admitted; waiting: service test\.agent\.echo/echo (is starting: "
                     r"\d+ s of its start_timeout_s 8 s|failed \(1 of max_failures)", r.stderr), \
        r.stderr
    agent.wait_for(lambda: agent.service_row().get("error") == advice.no_hello(8), timeout=40,
                   what="the start to time out")
    # Backing off: the job says what failed and when the next start is.
    assert re.fullmatch(r"waiting: service test\.agent\.echo/echo failed \(1 of max_failures "
                        r"\d+\): " + re.escape(advice.no_hello(8)) + r"; next start in \d+ s",
                        reason()), reason()


def test_fingerprint_pools_other_than_provides_name_the_mismatch_in_the_wait(start_agent,
                                                                             tmp_path):
    module = example_copy(tmp_path, ('"pools": {SERVICE: conf["slots"]}',
                                     '"pools": {"scorer": conf["slots"]}'))
    agent = start_agent([module], {"modelserver": {"load_s": 0}})
    job = agent.submit("generate", {"prompts": ["hi"]}, module="modelserver")

    def view() -> dict:
        return control.request(agent.state_dir, {"op": "job", "job_id": job})["job"]

    agent.wait_for(lambda: view()["reason"] is not None, timeout=30, what="a reason")
    assert view()["state"] == "queued"
    assert view()["reason"] == (
        "waiting: pool 'model' of service dev.example.modelserver/model has no tokens on this "
        f"node ({advice.pools_mismatch(['scorer'], ['model'])})")


def _bad_key(root: Path) -> Path:
    bad = example_copy(root)
    toml = bad / "oarbank-module.toml"
    toml.write_text(toml.read_text().replace("idle_timeout_s = 600", "idle_timout_s = 600"))
    return bad


def test_submit_to_a_refused_module_gives_the_refusal(start_agent, echo_module, tmp_path):
    bad = _bad_key(tmp_path)
    agent = start_agent([echo_module, bad])
    for name in ("modelserver", "dev.example.modelserver"):
        r = cli("submit", "--state-dir", str(agent.state_dir), "--module", name, "--stage",
                "generate", "--payload", "{}")
        assert r.returncode == 2
        assert (f"module '{name}' was refused when the agent started: "
                f"{bad / 'oarbank-module.toml'}: INVALID; "
                "services[0].idle_timout_s: unknown key; did you mean 'idle_timeout_s'?"
                in r.stderr), r.stderr


def test_the_agent_exits_2_when_no_module_loads_unless_allowed(tmp_path):
    bad = _bad_key(tmp_path)
    t0 = time.monotonic()
    r = cli("run", "--state-dir", str(tmp_path / "state"), "--module", str(bad),
            "--sandbox", "off")
    assert r.returncode == 2, r
    assert "did you mean 'idle_timeout_s'?" in r.stderr
    assert "no module could be loaded: each refusal above says why" in r.stderr
    assert time.monotonic() - t0 < 30
    proc = subprocess.Popen([sys.executable, "-m", "oarbank_agent", "run", "--state-dir",
                             str(tmp_path / "state2"), "--module", str(bad), "--sandbox", "off",
                             "--allow-empty"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("oarbank-agent: ready ") and "modules=-" in line, line
        status = control.request(tmp_path / "state2", {"op": "status"})["status"]
        assert status["services"] == [] and status["jobs"] == []
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 0, json.dumps(proc.returncode)


def test_a_daemon_that_dies_loading_after_its_hello_is_quoted(start_agent, tmp_path):
    # The first GPU run on a real H200 failed this way: the daemon said hello, then its model
    # load raised (cuInit under the sandbox), and the agent said only "closed its channel".
    module = example_copy(tmp_path, ("    time.sleep(load_s)  # a real module loads weights here\n",
                                     "    raise RuntimeError('cuInit failed: CUresult 304')\n"))
    agent = start_agent([module], {"modelserver": {"load_s": 0}})
    agent.submit("generate", {"prompts": ["hi"]}, module="modelserver")
    agent.wait_for(lambda: (agent.service_row("model").get("error") or "").startswith(
        advice.CHANNEL_CLOSED), timeout=60, what="the start to fail")
    error = agent.service_row("model")["error"]
    assert error.startswith(advice.closed_before_ready(advice.channel_closed("end of file"),
                                                       "x").split(";")[0]), error
    assert error.endswith("; the service's last log line: RuntimeError: cuInit failed: "
                          "CUresult 304"), error
