"""The multi-model bench's arithmetic (row by row), the reference module under other ids, the
evict-for-job scenario's reading of the agent's log, and the bench run end to end (quick)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.bench.multimodel import extrapolate, lower_bound, sequence
from harness.e2e.scenarios.evict_for_job import state_changes
from harness.modelcopy import LEDGER, MODELSERVER, ledger_as, modelserver_as
from oarbank_sdk import manifest as mf

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("seq", "bound"), [
    ([], 0),
    (["a"], 1),
    (["a", "a", "a"], 1),
    (["a", "b", "a"], 3),
    (["a", "a", "b", "b", "c"], 3),
    (sequence(60), 60),
    (sequence(7, ("x", "y")), 7),
])
def test_lower_bound_is_one_load_plus_one_per_switch(seq: list[str], bound: int) -> None:
    assert lower_bound(seq) == bound


def test_sequence_takes_the_modules_in_turn() -> None:
    assert sequence(5, ("a", "b", "c")) == ["a", "b", "c", "a", "b"]


@pytest.mark.parametrize(("waits", "switched", "idle_s", "to", "total"), [
    ([], [], 3.0, 600.0, 0.0),
    ([1.0], [False], 3.0, 600.0, 1.0),  # the first job: no idle timeout to wait out
    ([1.0, 4.0, 4.5], [False, True, True], 3.0, 600.0, 9.5 + 2 * 597),
    ([1.0, 0.2, 4.0], [False, False, True], 2.0, 10.0, 5.2 + 8),  # a job of the same module
])
def test_extrapolate_adds_the_longer_timeout_per_switch(waits: list[float], switched: list[bool],
                                                        idle_s: float, to: float,
                                                        total: float) -> None:
    assert extrapolate(waits, switched, idle_s, to) == pytest.approx(total)


def test_extrapolate_refuses_waits_and_switches_that_do_not_pair() -> None:
    with pytest.raises(ValueError, match="2 waits for 1 jobs"):
        extrapolate([1.0, 2.0], [False], 3.0)


def test_modelserver_as_changes_the_id_and_the_named_service_keys_only(tmp_path: Path) -> None:
    dest = modelserver_as(tmp_path / "m", "dev.oarbank.test.model-x", idle_timeout_s=7,
                          yieldable=False)
    got = mf.load(dest)
    ref = mf.load(MODELSERVER)
    assert got.id == "dev.oarbank.test.model-x"
    [svc], [ref_svc] = got.services, ref.services
    assert (svc.idle_timeout_s, svc.yieldable) == (7, False)
    assert (ref_svc.idle_timeout_s, ref_svc.yieldable) == (600, True)  # the example untouched
    assert svc.exec == ref_svc.exec and svc.reserves_host_memory
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        p.name for p in MODELSERVER.iterdir() if p.name != "__pycache__")


def test_modelserver_as_names_a_key_it_cannot_set_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="sets no 'idle_timout_s'"):
        modelserver_as(tmp_path / "m", "dev.oarbank.test.model-x", idle_timout_s=7)
    assert not (tmp_path / "m").exists()
    with pytest.raises(mf.ManifestError, match="module.id"):
        modelserver_as(tmp_path / "n", "Not An Id")
    assert not (tmp_path / "n").exists()


def test_ledger_as_is_the_ledger_module_whole_under_another_id(tmp_path: Path) -> None:
    dest = ledger_as(tmp_path / "l", "dev.oarbank.test.ledger-x")
    got = mf.load(dest)
    assert got.id == "dev.oarbank.test.ledger-x"
    assert [s.name for s in got.stages] == ["work"]
    # completed with the example's files, as a node's copy is (its service imports them)
    assert (dest / "model_service.py").read_bytes() == (MODELSERVER / "model_service.py"
                                                         ).read_bytes()
    assert (dest / "ledger_service.py").read_bytes() == (LEDGER / "ledger_service.py"
                                                          ).read_bytes()
    assert not (dest / "harness-base.txt").exists()
    assert mf.load(LEDGER).id == "dev.oarbank.e2e.ledger"  # the original untouched


def test_state_changes_read_from_an_agent_log() -> None:
    log = (
        "[agent.guest.log] 2026-12-07 04:44:46,411 oarbank_agent.services.supervisor INFO "
        "dev.x.a/model: ready -> stopping (stop): evicted\n"
        "2026-12-07 04:44:46,650 oarbank_agent.broker.handover INFO channel dev.x.a/model: "
        "closed by the service as it stops\n"
        "2026-12-07 04:44:47,711 oarbank_agent.services.supervisor INFO dev.x.b/model: "
        "stopped -> starting (start)\n")
    [(t1, m1, a1, b1), (t2, m2, a2, b2)] = state_changes(log)
    assert (m1, a1, b1) == ("dev.x.a", "ready", "stopping")
    assert (m2, a2, b2) == ("dev.x.b", "stopped", "starting")
    assert t2 - t1 == pytest.approx(1.3)


@pytest.mark.slow
def test_quick_multi_model_bench_runs_both_sides(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, "-m", "harness.bench", "--multi-model", "--quick",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=400, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "multi_model.json").read_text())
    ev, base = r["eviction"], r["baseline"]
    n = r["params"]["jobs"]
    assert len(ev["waits_s"]) == len(base["waits_s"]) == n
    assert ev["evictions"] == n - 1 and base["evictions"] == 0
    assert sum(ev["loads"].values()) == r["lower_bound_loads"] == n
    # without eviction a switch waits the idle timeout; with it, far less
    assert base["median_switch_wait_s"] >= base["idle_timeout_s"] * 0.5
    assert ev["median_switch_wait_s"] < base["median_switch_wait_s"]
    assert r["baseline_extrapolation_holds"] and r["ratio"] < 0.05
    assert "ratio" in proc.stdout and "lower bound" in proc.stdout
