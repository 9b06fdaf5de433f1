"""Each scenario fails when the behaviour it checks is broken. The agent is started with a
flag that breaks that behaviour (`--agent-flag`), and the report must say the scenario failed,
for the reason the scenario exists to catch, not for some other one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness_test_helpers import REPO

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, scenario: str, *agent_flags: str) -> tuple[int, dict]:
    out = tmp_path / "e2e"
    argv = [sys.executable, "-m", "harness", "--backend", "local", "--scenario", scenario,
            "--out", str(out), *(f"--agent-flag={f}" for f in agent_flags)]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=280,
                       stdin=subprocess.DEVNULL)
    report = json.loads((out / "report.json").read_text())
    [cell] = report["results"]
    assert cell["scenario"] == scenario and cell["backend"] == "local"
    return r.returncode, cell


def test_listener_refused_fails_when_the_agent_runs_services_unconfined(tmp_path: Path) -> None:
    rc, cell = _run(tmp_path, "listener-refused", "--sandbox=off")
    assert rc == 1 and cell["outcome"] == "failed"
    assert "a listen was granted under the agent" in cell["error"]


def test_idle_stop_fails_when_idle_services_are_stopped_at_once(tmp_path: Path) -> None:
    # A soft floor above what is ever available: the agent stops every idle yieldable
    # service at the next sample instead of after idle_timeout_s.
    rc, cell = _run(tmp_path, "idle-stop", "--mem-soft-floor=0.99", "--mem-sample-s=0.2")
    assert rc == 1 and cell["outcome"] == "failed"
    assert "right after the jobs the row should be running" in cell["error"]


def test_yield_fails_when_the_memory_guard_never_acts(tmp_path: Path) -> None:
    rc, cell = _run(tmp_path, "yield", "--mem-hard-floor=0", "--mem-soft-floor=0")
    assert rc == 1 and cell["outcome"] == "failed"
    assert "held preempt_memory" in cell["error"] and "timed out" in cell["error"]


def test_gpu_shared_start_fails_when_no_node_has_the_api(tmp_path: Path) -> None:
    rc, cell = _run(tmp_path, "gpu-shared-start", "--gpu-apis=opencl")
    assert rc == 1 and cell["outcome"] == "failed"
    assert "GPU_API_MISSING" in cell["error"]
