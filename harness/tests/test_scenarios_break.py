"""Each scenario fails when the behaviour it checks is broken. The agent is started with a
flag that breaks that behaviour (`--agent-flag`), or with the agent's test-only fault
injection (`OARBANK_AGENT_FAULT`, in the harness's environment: the local backend's agents
inherit it), and the report must say the scenario failed, for the reason the scenario exists
to catch, not for some other one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from harness_test_helpers import REPO

from testsupport import memhog

pytestmark = pytest.mark.slow
# The yield scenario pushes the host's memory down: it runs in the group of every test that
# does (agent/tests/test_memory_pressure.py), never beside another one.
MEMORY_PRESSURE = pytest.mark.xdist_group(memhog.XDIST_GROUP)


def _run(tmp_path: Path, scenario: str, *agent_flags: str, modules: Path | None = None,
         fault: str | None = None, env_extra: dict[str, str] | None = None) -> tuple[int, dict]:
    out = tmp_path / "e2e"
    argv = [sys.executable, "-m", "harness", "--backend", "local", "--scenario", scenario,
            "--out", str(out), *(f"--agent-flag={f}" for f in agent_flags)]
    if modules is not None:
        argv += ["--modules-dir", str(modules)]
    env = None if fault is None else dict(os.environ, OARBANK_AGENT_FAULT=fault)
    if env_extra:
        env = dict(env or os.environ, **env_extra)
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=280,
                       stdin=subprocess.DEVNULL, env=env)
    report = json.loads((out / "report.json").read_text())
    if fault is not None:  # the fault really was on (the agent says so in its log)
        logs = "".join(p.read_text(errors="replace") for p in out.rglob("agent.log"))
        assert f"OARBANK_AGENT_FAULT={fault}" in logs
    [cell] = report["results"]
    assert cell["scenario"] == scenario and cell["backend"] == "local"
    return r.returncode, cell


def test_listener_refused_fails_when_the_agent_runs_services_unconfined(tmp_path: Path) -> None:
    rc, cell = _run(tmp_path, "listener-refused", "--sandbox=off")
    assert rc == 1 and cell["outcome"] == "failed"
    assert "a listen was granted under the agent" in cell["error"]


def test_listener_refused_fails_when_conform_does_not_watch_attempts(tmp_path: Path) -> None:
    # The conformance kit's test hook launches services without its attempt watch (the
    # sandbox still refuses every call): the listener, which hides its refusals and serves,
    # then passes conform, and the scenario must fail for exactly that.
    rc, cell = _run(tmp_path, "listener-refused",
                    env_extra={"OARBANK_CONFORM_FAULT": "no_attempt_watch"})
    assert rc == 1 and cell["outcome"] == "failed"
    assert "oarbank-sdk conform should fail the listener (exit 1, FAIL lines): exit 0" in cell["error"]
    conform_txt = "".join(p.read_text() for p in (tmp_path / "e2e").rglob("conform.txt"))
    assert ("warn network attempts: FAULT INJECTED (test only): "
            "OARBANK_CONFORM_FAULT=no_attempt_watch") in conform_txt


def test_idle_stop_fails_when_the_service_is_not_stopped_after_idle_timeout(
        tmp_path: Path) -> None:
    # The agent offers no switch that turns idle stop off; seen from outside, a service that
    # is not stopped 3 s after its last user is what a 600 s idle timeout gives. (A flag on
    # the agent would break the agent itself instead: asked for.)
    mods = tmp_path / "modules"
    shutil.copytree(REPO / "harness" / "e2e" / "modules", mods)
    toml = mods / "fastmodel" / "oarbank-module.toml"
    toml.write_text(toml.read_text().replace("idle_timeout_s = 3\n", "idle_timeout_s = 600\n"))
    assert "idle_timeout_s = 600" in toml.read_text()
    rc, cell = _run(tmp_path, "idle-stop", modules=mods)
    assert rc == 1 and cell["outcome"] == "failed"
    assert "waiting for idle-a model row: stopped with no users" in cell["error"]


@MEMORY_PRESSURE
def test_yield_fails_when_the_memory_guard_never_acts(tmp_path: Path) -> None:
    rc, cell = _run(tmp_path, "yield", "--mem-hard-floor=0", "--mem-soft-floor=0")
    assert rc == 1 and cell["outcome"] == "failed"
    assert "held preempt_memory" in cell["error"] and "timed out" in cell["error"]


def test_gpu_shared_start_fails_when_no_node_has_the_api(tmp_path: Path) -> None:
    rc, cell = _run(tmp_path, "gpu-shared-start", "--gpu-apis=opencl")
    assert rc == 1 and cell["outcome"] == "failed"
    assert "GPU_API_MISSING" in cell["error"]


def test_crash_loop_fails_when_the_failing_service_is_never_withdrawn(tmp_path: Path) -> None:
    # Seen from outside, an agent that never withdraws a failing service is one whose limit
    # is never reached: max_failures 1000.
    mods = tmp_path / "modules"
    shutil.copytree(REPO / "harness" / "e2e" / "modules", mods)
    toml = mods / "crashy" / "oarbank-module.toml"
    toml.write_text(toml.read_text().replace("max_failures = 3", "max_failures = 1000"))
    assert "max_failures = 1000" in toml.read_text()
    rc, cell = _run(tmp_path, "crash-loop", modules=mods)
    assert rc == 1 and cell["outcome"] == "failed"
    assert "waiting for crash-a model row: withdrawn" in cell["error"]


# (scenario, the agent's test-only fault that breaks what it checks, the failure it must report)
AGENT_FAULTS = [
    ("idle-stop", "no_idle_stop", "waiting for idle-a model row: stopped with no users"),
    ("agent-restart", "keep_predecessor_groups",
     "waiting for the old service process group to be ended"),
    ("crash-loop", "flat_backoff", "restart gaps"),
    ("crash-loop", "bare_start_errors", "the withdrawn reason is not the module's"),
    ("yield", "charge_released", "a released attempt was charged"),
    ("evict-for-job", "no_demand_eviction", "did not start within"),
]


@pytest.mark.parametrize(("scenario", "fault", "error"), [
    pytest.param(*case, id=f"{case[0]}-{case[1]}",
                 marks=[MEMORY_PRESSURE] if case[0] == "yield" else [])
    for case in AGENT_FAULTS])
def test_scenario_fails_when_the_agent_breaks_what_it_checks(tmp_path: Path, scenario: str,
                                                              fault: str, error: str) -> None:
    rc, cell = _run(tmp_path, scenario, fault=fault)
    assert rc == 1 and cell["outcome"] == "failed"
    assert error in cell["error"], cell["error"]
