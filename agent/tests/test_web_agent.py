"""examples/openai-compatible under a real ``oarbank-agent run``: the FastAPI app served by
``oarbank_sdk.web.serve_asgi`` as a warm endpoint service, jobs written against the official
``openai`` client (``oarbank_sdk.web.HTTPTransport``), every process in the agent's sandbox,
every connection brokered by the agent (SCM_RIGHTS, nothing listens)."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import MODFILES, REPO, RunningAgent, alive

EXAMPLE = REPO / "examples" / "openai-compatible"
SETTINGS = {"openai-compatible": {"load_s": 0.5, "token_s": 0.01, "slots": 2}}
PROMPTS = ["warm services load once", "nothing listens", "héllo wörld", "a", "b c", "d e f"]

pytestmark = pytest.mark.slow


def _expected(prompt: str) -> str:
    import hashlib
    return f"{prompt[::-1]} [{hashlib.sha256(prompt.encode()).hexdigest()[:8]}]"


@pytest.fixture
def module(tmp_path: Path) -> Path:
    dst = tmp_path / "openai-compatible"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_openai_client_jobs_reach_the_fastapi_service_and_survive_its_restart(
        start_agent: Callable[..., RunningAgent], module: Path) -> None:
    agent = start_agent([module], SETTINGS)
    first = agent.run_job("chat", {"prompts": PROMPTS}, module="openai-compatible")
    assert first["state"] == "succeeded", agent.why(first)
    assert first["result"]["payload"]["texts"] == [_expected(p) for p in PROMPTS]
    (served_by,) = first["result"]["provenance"]["service"]  # one process, loaded once
    assert served_by.endswith("-loads-1"), served_by
    if os.geteuid() == 0:  # as root every wall is up here (an ordinary user may lack some)
        sb = agent.status()["sandbox"]
        assert sb.get("seccomp_socket") == "enforced", sb
    baseline = agent.settled_fds()

    streamed = agent.run_job("chat", {"prompts": PROMPTS[:3], "stream": True,
                                      "api": "completions"}, module="openai-compatible")
    assert streamed["state"] == "succeeded", streamed
    assert streamed["result"]["payload"]["texts"] == [_expected(p) for p in PROMPTS[:3]]
    assert all(0 < t < 5 for t in streamed["result"]["provenance"]["first_token_s"])
    agent.wait_fds_back(baseline)  # the attempt's connector and connections all closed

    # The daemon dies: the agent restarts the service; the next job's client reaches the new one.
    pid = int((agent.module_data("dev.example.openai-compatible") / "model.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    agent.wait_for(lambda: not alive(pid), 10, "the daemon gone")
    again = agent.run_job("chat", {"prompts": PROMPTS[:2]}, module="openai-compatible")
    assert again["state"] == "succeeded", agent.why(again)
    assert again["result"]["payload"]["texts"] == [_expected(p) for p in PROMPTS[:2]]
    (after,) = again["result"]["provenance"]["service"]
    assert after != served_by and after.endswith("-loads-1"), (served_by, after)


@pytest.fixture
def battery_module(tmp_path: Path) -> Path:
    """examples/openai-compatible with tests/modfiles/web_app.py as its app and web_runner.py as
    its runner: the service is the example's (serve_asgi), the app and the job are the test's."""
    dst = tmp_path / "openai-compatible"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(MODFILES / "web_app.py", dst / "app.py")
    shutil.copy(MODFILES / "web_runner.py", dst / "web_runner.py")
    manifest = dst / "oarbank-module.toml"
    text = manifest.read_text().replace("{bundle}/model_runner.py", "{bundle}/web_runner.py")
    text = text.replace('[[stages]]\nname = "chat"', '[[stages]]\nname = "chat"\ntimeout_s = 300')
    manifest.write_text(text.replace('lifecycle = "on_demand"', 'lifecycle = "on_demand"\n'
                                     'restart = { backoff_initial_s = 0.1, backoff_max_s = 0.5 }'))
    return dst


def test_every_web_client_in_a_sandboxed_attempt_and_a_restart_mid_pool(
        start_agent: Callable[..., RunningAgent], battery_module: Path) -> None:
    agent = start_agent([battery_module], SETTINGS)
    job = agent.run_job("chat", {}, module="openai-compatible")
    assert job["state"] == "succeeded", agent.why(job)
    r = job["result"]["payload"]
    first = r["pid_before"]
    assert r["thread_pids"] == [first] and r["task_pids"] == [first]  # threads and tasks
    assert r["events"] == ['data: {"i": 0}', 'data: {"i": 1}', 'data: {"i": 2}', "data: [DONE]"]
    assert r["digest"] == r["digest_expected"]  # 100 MB, streamed in
    assert r["boom_status"] == 500 and r["after_boom"] == 200
    assert r["dropped_first_bytes"] == "HTTP/1.1 200" and r["after_drop"] == 200
    assert r["dying"] == first
    assert r["pid_after"] not in (None, first), r  # the restarted service answered
    # The pool's dead connections were dropped before reuse (never a read or protocol error on
    # one), and a connect made during the restart waited for it; the most the agent may answer
    # meanwhile is a refusal naming service_unavailable.
    assert all(e.startswith("ConnectError") and "service_unavailable" in e
               for e in r["restart_errors"]), r["restart_errors"]
