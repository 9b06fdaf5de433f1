"""examples/openai-compatible passes `oarbank-sdk check` and `oarbank-sdk conform`: its FastAPI
service under serve_asgi in the sandbox (no network attempt, never listening), its openai-client
runner's goldens (chat and completions, streamed and not) through a real connector."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from platform_marks import conform_kit  # sdk/tests

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "openai-compatible"


pytestmark = conform_kit


def _sdk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_sdk", *args], capture_output=True,
                          text=True, timeout=240, cwd=ROOT)


def test_the_example_checks():
    done = _sdk("check", str(EXAMPLE))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("ok dev.example.openai-compatible 0.1.0"), done.stdout


def test_the_example_conforms_in_the_sandbox():
    done = _sdk("conform", str(EXAMPLE))
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.fullmatch(r"dev\.example\.openai-compatible 0\.1\.0: \d+ passed, 0 failed, 0 skipped",
                        lines[-1]), lines[-1]
    for expected in ("golden hello", "golden streamed_chat", "golden completions",
                     "golden streamed_completions", "spec chat completion", "spec completion",
                     "spec messages missing is 422", "service model: never listens (after requests)",
                     "service model: ended", "service model: process group gone"):
        assert any(line.startswith(f"ok   {expected}") for line in lines), (expected, lines)
    # The lifespan startup ran before ready, and ready was said on the channel.
    assert any(line.startswith("ok   service model: ready: after ") and
               line.endswith("(said on the channel; the ready op agrees)") for line in lines)
    sandbox = next(line for line in lines if line.startswith(("ok   sandbox", "warn sandbox")))
    if sandbox.startswith("ok"):  # every process of the service watched: it tried nothing
        for when in ("after ready", "after requests"):
            assert any(line.startswith(f"ok   service model: no network attempts ({when}): none")
                       for line in lines), lines


def test_the_second_demo_runs_jobs_through_one_warm_service():
    # demo.py: a real `oarbank-agent run`, jobs submitted with its command line, half streamed.
    done = subprocess.run([sys.executable, str(EXAMPLE / "demo.py"), "--jobs", "3", "--load-s",
                           "0.3", "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["succeeded"] == 3
    (served_by,) = summary["service_processes"]  # every answer from one process, loaded once
    assert served_by.endswith("-loads-1"), served_by
    assert summary["texts"][1] == "snetsil gnihton [83d020c3]"
    assert summary["first_token_ms_median"] > 0
