"""The chaos run: SIGKILLs of the agent while runners are mid-work. With --keep-services on
local, two kills cost no model load, lose no job, and no finished attempt's work is run again
(counted from the service's ledger, not from the agent). The ledger's reading, row by row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness_test_helpers import REPO

from harness.e2e.chaos import figures, ledger_counts, mid_work


def test_the_ledger_counts_each_jobs_start_and_done() -> None:
    lines = ["start a", "done a", "recorded a", "start b", "start c", "done c", "done c",
             "start b", "", "noise x", "done"]
    assert ledger_counts(lines) == {"start": {"a": 1, "b": 2, "c": 1},
                                    "done": {"a": 1, "c": 2}, "recorded": {"a": 1}}
    assert mid_work(lines) == ["b"]
    assert mid_work(["start a", "done a"]) == []
    fig = figures(2, True, 7, [0.1, 0.2], ["42"], ["a", "b", "c"], 0,
                  {j: {"state": "succeeded", "history": []} for j in "abc"}, lines)
    assert (fig.done_twice, fig.started_twice, fig.not_done, fig.lost) == (["c"], ["b"],
                                                                           ["b"], 0)


@pytest.mark.parametrize(("ledger", "released", "after_result", "unfinished"), [
    # killed between its `done` and its result, run again: the window no agent can see
    (["start j", "done j", "start j", "done j", "recorded j"], 1, [], ["j"]),
    # a finished attempt (its result recorded) run again: what the agent must never do
    (["start j", "done j", "recorded j", "start j", "done j", "recorded j"], 1, ["j"], []),
    # done twice with no attempt released: neither (counted in done_twice alone)
    (["start j", "done j", "done j", "recorded j"], 0, [], []),
    # once: none
    (["start j", "done j", "recorded j"], 0, [], []),
])
def test_work_done_twice_is_told_apart_by_whether_its_result_was_recorded(
        ledger: list[str], released: int, after_result: list[str],
        unfinished: list[str]) -> None:
    fig = figures(1, True, 7, [0.1], ["42"], ["j"], 0,
                  {"j": {"state": "succeeded", "released": released, "history": []}}, ledger)
    assert (fig.done_twice_after_result, fig.done_twice_unfinished) == (after_result, unfinished)


@pytest.mark.slow
def test_two_kills_with_keep_services_cost_no_load_lose_no_job_rerun_no_finished_work(
        tmp_path: Path) -> None:
    out = tmp_path / "chaos"
    r = subprocess.run([sys.executable, "-m", "harness.e2e.chaos", "--backend", "local",
                        "--kills", "2", "--jobs", "16", "--seed", "2", "--keep-services",
                        "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=280,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    fig = json.loads((out / "chaos.json").read_text())
    assert fig["outcome"] == "passed" and fig["kills"] == 2 and fig["keep_services"]
    # Counted from the node's model.loads: the one first load, none for the kills.
    assert len(fig["load_lines"]) == 1 and fig["extra_loads"] == 0, fig
    # Counted from the jobs' records: every job submitted is final and succeeded.
    assert fig["submitted"] == 16 and fig["states"] == {"succeeded": 16}, fig
    assert fig["jobs_on_disk"] == fig["submitted"] and fig["lost"] == 0, fig
    # Counted by the service: no finished attempt's work run again, and every success did its
    # work. A runner killed between its `done` and its result (a window of milliseconds the
    # agent cannot see: the effect happened, the record did not) runs again, so its work may
    # be done twice; each such job had an attempt released by a kill, at most one per runner
    # the kills interrupted.
    assert fig["done_twice_after_result"] == [] and fig["not_done"] == [], fig
    assert sorted(fig["done_twice_unfinished"]) == fig["done_twice"], fig
    assert len(fig["done_twice"]) <= fig["released"], fig
    assert "0.00 load(s) per kill" in r.stdout
