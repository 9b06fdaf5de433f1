"""The chaos run with --keep-services on local: two SIGKILLs of the agent under a flow of
jobs cost no model load, and every job submitted succeeds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness_test_helpers import REPO

pytestmark = pytest.mark.slow


def test_two_kills_with_keep_services_cost_no_load_and_lose_no_job(tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    r = subprocess.run([sys.executable, "-m", "harness.chaos", "--backend", "local",
                        "--kills", "2", "--seed", "2", "--keep-services", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=280,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    fig = json.loads((out / "chaos.json").read_text())
    assert fig["outcome"] == "passed" and fig["kills"] == 2 and fig["keep_services"]
    # Counted from the node's model.loads: the one first load, none for the kills.
    assert len(fig["load_lines"]) == 1 and fig["extra_loads"] == 0, fig
    assert fig["service_pids"] == [int(fig["load_lines"][0])], fig
    # Counted from the jobs' records: every job submitted is final and succeeded.
    assert fig["submitted"] >= 1 and fig["states"] == {"succeeded": fig["submitted"]}, fig
    assert fig["jobs_on_disk"] == fig["submitted"], fig
    assert "0.00 load(s) per kill" in r.stdout
