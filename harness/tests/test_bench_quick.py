"""The quick bench's smallest part runs end to end against a real agent and writes
results.json with the agreed shape. Speed is not asserted (that is the bench's job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bench import stats
from harness.bench.report import table

REPO = Path(__file__).resolve().parents[2]
METRIC_KEYS = {"unit", "median", "p99", "baseline", "baseline_p99", "baseline_name", "ratio",
               "samples", "targets", "ok"}


def test_quick_request_path_writes_results_json(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench", "--quick", "--only", "request_path",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["schema"] == 1 and results["quick"] is True
    assert list(results["figures"]) == ["request_path"]
    fig = results["figures"]["request_path"]
    assert "error" not in fig
    expected = {"brokered_per_request_latency", "brokered_keepalive_latency",
                "unix_per_request_latency", "unix_keepalive_latency",
                "naive_tcp_keepalive_latency", "brokered_per_request_rps",
                "brokered_keepalive_rps"}
    assert set(fig["metrics"]) >= expected
    for name, m in fig["metrics"].items():
        assert set(m) >= METRIC_KEYS, name
        assert m["samples"] > 0 and m["median"] > 0, name
        assert m["baseline"] is not None and m["ratio"] is not None, name
        assert m["ratio"] == pytest.approx(m["median"] / m["baseline"]), name
        if m["unit"] == "ms":
            assert m["p99"] >= m["median"], name
    assert fig["metrics"]["brokered_per_request_latency"]["targets"] == {"ratio": "<= 1.0"}
    assert fig["metrics"]["brokered_keepalive_latency"]["ok"] in (True, False)
    # The printed table names every metric of the file.
    for name in fig["metrics"]:
        assert name in proc.stdout


def test_quick_asgi_path_runs_both_sides_in_one_run(tmp_path: Path) -> None:
    # Figure 7: the FastAPI example under serve_asgi behind a real agent, and the same app
    # under uvicorn on loopback TCP, every loop measured on both sides.
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench", "--quick", "--only", "asgi_path",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fig = json.loads(out.read_text())["figures"]["asgi_path"]
    assert "error" not in fig, fig
    assert set(fig["metrics"]) == {"asgi_connect_latency", "asgi_per_request_latency",
                                   "asgi_keepalive_latency",
                                   "asgi_time_to_first_token", "asgi_per_request_rps",
                                   "asgi_keepalive_rps"}
    for name, m in fig["metrics"].items():
        assert set(m) >= METRIC_KEYS, name
        assert m["samples"] > 0 and m["median"] > 0 and m["baseline"] > 0, name
        assert "loopback TCP" in m["baseline_name"], name
    assert set(fig["details"]) == {f"{side}_{loop}" for side in ("asgi", "tcp")
                                   for loop in ("connect", "per_request", "keepalive", "ttft")}
    assert fig["metrics"]["asgi_time_to_first_token"]["targets"] == {"ratio": "<= 1.0"}


def test_unknown_figure_is_refused_by_name(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.bench", "--only", "nosuch", "--out",
         str(tmp_path / "r.json")],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.returncode == 2
    assert "unknown figure(s) nosuch" in proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_stats_percentiles_ratios_and_targets() -> None:
    values = [float(i) for i in range(1, 101)]
    assert stats.median(values) == 50.5
    assert stats.p99(values) == 99.0
    assert stats.percentile([3.0], 99) == 3.0
    assert stats.median([]) is None and stats.p99([]) is None
    m = stats.metric([0.002, 0.004], unit="ms", scale=1000, baseline=[0.002],
                     targets={"ratio": "<= 1.25"})
    assert m["median"] == pytest.approx(3.0) and m["ratio"] == pytest.approx(1.5)
    assert m["ok"] is False
    assert stats.metric([1.0], unit="s", targets={"median": ">= 1"})["ok"] is True
    assert stats.metric([1.0], unit="s")["ok"] is None
    with pytest.raises(ValueError, match="expected '<= X'"):
        stats.check_target(1.0, "< 2")


def test_table_shows_errors_and_targets() -> None:
    results = {"figures": {
        "a": {"title": "A", "metrics": {"m": stats.metric([1.0], unit="s",
                                                          targets={"median": "<= 2"})}},
        "b": {"title": "B", "metrics": {}, "error": "RuntimeError: boom"},
    }}
    text = table(results)
    assert "median <= 2" in text and "yes" in text
    assert "ERROR" in text and "boom" in text
