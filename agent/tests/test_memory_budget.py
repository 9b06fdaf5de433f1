"""Memory accounting: the pure admission rules, then the same through a real agent (a job that
does not fit waits with a readable reason; one that can never fit is refused at submit)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agent_helpers import read_jsonl, write_module
from test_services import max_overlap

from oarbank_agent.jobs.admission import Admission, Request
from oarbank_agent.protection.decisions import hold_override, parse_fraction
from oarbank_agent.services import lifecycle as lc


def test_jobs_charge_the_budget_and_wait_in_order() -> None:
    a = Admission()
    a.budget_gb = 4.0
    a.enqueue(Request("j1", mem_gb=3.0))
    a.enqueue(Request("j2", mem_gb=2.0))
    a.enqueue(Request("j3", mem_gb=0.5))  # fits, but j2 waits for memory first: no overtaking
    a.enqueue(Request("j4"))  # charges nothing: goes ahead
    assert [r.job_id for r in a.admit()] == ["j1", "j4"]
    assert a.why_waiting("j2") == "waiting for memory: needs 2 GB; 3 of 4 GB budget charged"
    a.release("j1")
    assert [r.job_id for r in a.admit()] == ["j2", "j3"]
    assert a.charged_gb() == 2.5


def test_a_reserving_service_is_charged_once_for_its_jobs() -> None:
    a = Admission()
    a.budget_gb = 2.0
    a.enqueue(Request("j1", mem_gb=0.5, services_mem={"m/s": 1.0}))
    a.enqueue(Request("j2", mem_gb=0.5, services_mem={"m/s": 1.0}))
    a.enqueue(Request("j3", mem_gb=0.5, services_mem={"m/s": 1.0}))
    # 1.0 (service, once) + 0.5 + 0.5 = 2.0; the third does not fit
    assert [r.job_id for r in a.admit()] == ["j1", "j2"]
    assert a.charged_gb() == 2.0


def test_gpu_rules_in_admission() -> None:
    a = Admission()
    a.gpu_allowed = False
    a.enqueue(Request("g1", gpu="shared"))
    a.enqueue(Request("c1"))
    assert [r.job_id for r in a.admit()] == ["c1"]
    assert "not allowed" in (a.why_waiting("g1") or "")
    a.gpu_allowed = True
    a.enqueue(Request("x1", gpu="exclusive"))
    assert [r.job_id for r in a.admit()] == ["g1"]  # x1 waits: a GPU job holds the GPU
    a.release("g1")
    assert [r.job_id for r in a.admit()] == ["x1"]
    a.enqueue(Request("g2", gpu="shared"))
    assert a.admit() == []
    a.paused = "memory pressure"
    a.release("x1")
    assert a.admit() == [] and a.why_waiting("g2") == "memory pressure"


def test_floors_parse_and_holds_override_the_lifecycle() -> None:
    assert parse_fraction("12%", "x") == 0.12 and parse_fraction("0.08", "x") == 0.08
    assert parse_fraction("8", "x") == 0.08
    start = lc.Decision("start")
    assert hold_override(lc.State.STOPPED, start, held="preempt_memory", gpu_missing=False,
                         shutting_down=False) == lc.Decision()
    assert hold_override(lc.State.READY, lc.Decision(), held="preempt_protection",
                         gpu_missing=False, shutting_down=False) == \
        lc.Decision("stop", reason="preempt_protection")
    assert hold_override(lc.State.STOPPED, start, held=None, gpu_missing=True,
                         shutting_down=False) == lc.Decision()
    assert hold_override(lc.State.STOPPED, start, held=None, gpu_missing=False,
                         shutting_down=False) == start


def test_agent_runs_jobs_within_the_memory_budget(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", stages=[
        {"name": "big", "timeout_s": 60, "requires": {"resources": {"mem_gb": 0.75}}},
        {"name": "huge", "timeout_s": 60, "requires": {"resources": {"mem_gb": 3}}}],
        service={"reserves_host_memory": True})
    agent = start_agent([mod], extra_args=["--memory-budget-gb", "1", "--gpu-apis", "none"])
    assert agent.status()["protection"]["budget_gb"] == 1.0
    ids = [agent.submit("big", {"sleep_s": 0.8}) for _ in range(2)]
    agent.wait_for(lambda: any(j["state"] == "queued" and (j["reason"] or "").startswith(
        "waiting for memory") for j in agent.status()["jobs"]), what="a job waiting for memory")
    assert all(agent.wait(j)["state"] == "succeeded" for j in ids)
    runs = read_jsonl(agent.module_data() / "runs.jsonl")
    start = {r["attempt"]: r["t"] for r in runs if r["event"] == "start"}
    end = {r["attempt"]: r["t"] for r in runs if r["event"] == "end"}
    assert max_overlap([(start[a], end[a]) for a in start]) == 1
    r = subprocess.run([sys.executable, "-m", "oarbank_agent", "submit", "--state-dir",
                        str(agent.state_dir), "--module", "echo", "--stage", "huge",
                        "--payload", "{}"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "MEMORY_BUDGET: needs 3 GB; this node's budget is 1 GB" in r.stderr
