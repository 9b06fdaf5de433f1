"""The bench's account of where the time goes (issue 29): the py-spy summary of a figure, the
warm figure's phases, and the lines printed under a figure that missed a target. Pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.bench.figures.warm import phases
from harness.bench.profile import summarize
from harness.bench.report import where_time_goes


def test_a_profile_summary_counts_samples_and_names_the_agents_own_frames(tmp_path: Path) -> None:
    loop = "<module> (oarbank_agent/__main__.py:9);Handle._run (asyncio/events.py:80)"
    (tmp_path / "fig-bench-agent.txt").write_text(
        f"{loop};JobStore.save (oarbank_agent/jobs/store.py:95);dumps (json/__init__.py:238) 3\n"
        f"{loop};MessageStream._on_readable (oarbank_agent/broker/msgstream.py:128) 1\n")
    (tmp_path / "fig-warm-agent-0.txt").write_text(
        f"{loop};MessageStream._on_readable (oarbank_agent/broker/msgstream.py:128) 4\n")
    s = summarize(sorted(tmp_path.glob("fig-*.txt")), rate=500)
    assert s["samples"] == 8 and s["cpu_s"] == pytest.approx(8 / 500)
    assert s["self"][0] == ["MessageStream._on_readable (oarbank_agent/broker/msgstream.py:128)",
                            0.625]
    # The loop's and the entry point's frames are in every sample: they say nothing.
    assert [f for f, _ in s["inclusive"]] == [
        "MessageStream._on_readable (oarbank_agent/broker/msgstream.py:128)",
        "JobStore.save (oarbank_agent/jobs/store.py:95)"]


def test_the_warm_phases_come_from_the_job_records() -> None:
    # Two slots, four jobs: the service is ready 0.3 s after the load; two waves of 0.2 s and
    # 0.25 s; each slot's next job starts 0.05 s after the one before it ended.
    jobs = [{"started_at": 10.3, "finished_at": 10.5}, {"started_at": 10.3, "finished_at": 10.45},
            {"started_at": 10.55, "finished_at": 10.8}, {"started_at": 10.5, "finished_at": 10.7}]
    split = phases(t0=8.0, t_end=10.81, load_s=2.0, jobs=jobs, parallel=2)
    assert split == pytest.approx({"service_start": 0.3, "runners": 0.2 + 0.25,
                                   "hand_offs": 0.05 + 0.05, "tail": 0.01})


def test_only_figures_that_missed_a_target_are_explained() -> None:
    met = {"ok": True}
    missed = {"ok": False}
    results = {"figures": {
        "connect_handoff": {"title": "3. connect handoff", "metrics": {"a": missed, "b": met},
                            "where": ["CPU per connect: job 100 us"]},
        "footprint": {"title": "5. footprint", "metrics": {"c": met}},
    }}
    lines = where_time_goes(results)
    assert lines[0] == "- 3. connect handoff: missed a"
    assert "  CPU per connect: job 100 us" in lines
    assert any("--profile DIR --only connect_handoff" in line for line in lines)
    assert not any("footprint" in line for line in lines)


def test_the_python_floor_of_a_hand_over_measures_every_side_and_leaves_nothing() -> None:
    """handover_floor.py: the three processes run the contract's lines for real (descriptors
    over SCM_RIGHTS, receipts), each side reports its CPU per connect, and the two it forked
    are gone when it answers."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "harness.bench.handover_floor", "60"],
                            stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[2])
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    got = json.loads(out)
    assert len(got["latencies_s"]) == 60 and all(x > 0 for x in got["latencies_s"])
    for side in ("job", "agent", "service"):
        assert got[f"{side}_cpu_us"] > 0, got
    forked = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == proc.pid:
                    forked.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    assert not forked, f"left running: {forked}"
