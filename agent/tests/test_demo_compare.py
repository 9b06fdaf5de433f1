"""``oarbank-agent demo --compare``: after the warm run, the same jobs run cold and are measured
(each loads the model itself), and both are printed side by side."""

from __future__ import annotations

import json
import subprocess
import sys

from oarbank_agent.operate import demo
from oarbank_agent.operate.demo_cold import ColdRun, run_cold


def _demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", "demo", *args],
                          capture_output=True, text=True, timeout=300)


def test_compare_measures_the_same_jobs_cold() -> None:
    r = _demo("--jobs", "3", "--load-s", "0.2", "--json", "--compare")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["jobs"], out["succeeded"], out["model_loads"]) == (3, 3, 1)
    cold = out["cold"]
    # Measured, not computed: three processes each wrote their own load.
    assert (cold["succeeded"], cold["model_loads"], cold["parallel"]) == (3, 3, demo.SLOTS)
    assert cold["wall_s"] > 0.2  # at least one load's sleep


def test_compare_prints_both_runs() -> None:
    r = _demo("--jobs", "2", "--load-s", "0.1", "--compare")
    assert r.returncode == 0, r.stderr
    assert "the same 2 jobs cold (each loads the model itself, 4 at a time):" in r.stdout
    assert "model loads:    2 (warm: 1)" in r.stdout
    assert "cold / warm:" in r.stdout and "1 more model loads" in r.stdout


def test_a_failing_cold_job_is_reported(tmp_path) -> None:
    # An example whose model cannot load: every cold job fails, and says why.
    broken = tmp_path / "example"
    broken.mkdir()
    (broken / "model_service.py").write_text(
        "def load_model(d, s):\n    raise RuntimeError('no weights here')\n")
    run = run_cold(broken, tmp_path / "data", [["p"], ["q"]], 0.0, 2)
    assert isinstance(run, ColdRun)
    assert (run.jobs, run.succeeded, run.model_loads) == (2, 0, 0)
    assert all("RuntimeError: no weights here" in e for e in run.errors)
