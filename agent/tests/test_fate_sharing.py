"""A job's work is done once, even when the agent dies under it (issue 44).

``kill -9`` of a real agent mid-job: its runner and the runner's own child are gone at once
(the agent's watcher, ``platform/posix/tether.py``), not when the next agent gets round to
them; with ``--keep-services`` the kept service stays up while its runner goes. The next agent
collects an attempt whose runner had finished (``result.json`` or a ``failure.json`` naming
its fault: ``jobs/collect.py``), records it so and runs nothing again; an attempt that had not
finished runs again. Real agents, real runners (``modfiles/fate_runner.py``)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import MODFILES, alive, end_leftovers, job_record, read_jsonl, write_module

KEEP = ["--keep-services"]
GONE_WITHIN_S = 2.0


@pytest.fixture(autouse=True)
def no_orphans(tmp_path: Path) -> Iterator[None]:
    """A failing test's processes (runners, their children, a kept service) end here."""
    yield
    left = end_leftovers(tmp_path)
    assert not left, "left behind:\n" + "\n".join(left)


def fate_module(root: Path) -> Path:
    mod = write_module(root, runner={"exec": ["python", "-I", "{bundle}/fate_runner.py"]})
    shutil.copy(MODFILES / "fate_runner.py", mod / "fate_runner.py")
    return mod


def notes(agent: Any, job: str) -> list[dict[str, Any]]:
    """What the job's runners said, every attempt (``a<n>/fate.jsonl``)."""
    rows: list[dict[str, Any]] = []
    for f in sorted((agent.state_dir / "jobs" / job).glob("a*/fate.jsonl")):
        rows += read_jsonl(f)
    return rows


def said(agent: Any, job: str, event: str) -> list[dict[str, Any]]:
    return [n for n in notes(agent, job) if n["event"] == event]


def wait_gone(pids: list[int], within_s: float) -> float:
    """Seconds until none of ``pids`` is alive; fails after ``within_s``."""
    t0 = time.monotonic()
    while any(alive(p) for p in pids):
        if time.monotonic() - t0 > within_s:
            raise AssertionError(f"still alive {within_s:g} s after the agent was killed: "
                                 f"{[p for p in pids if alive(p)]}")
        time.sleep(0.02)
    return time.monotonic() - t0


@pytest.mark.parametrize("keep", [False, True], ids=["plain", "keep-services"])
def test_agent_killed_mid_job_its_runner_and_grandchild_go_at_once(
        start_agent: Any, tmp_path: Path, keep: bool) -> None:
    mod = fate_module(tmp_path / "m")
    # With the flag the job holds the kept endpoint service's pool: the service stays, the
    # runner goes. Without it, a job with no service.
    first = start_agent([mod], {"echo": {"slots": 2}}, extra_args=KEEP if keep else [])
    job = first.submit("echo" if keep else "plain", {"grandchild": True, "work_s": 600})
    first.wait_for(lambda: bool(said(first, job, "start")), what="the runner at work")
    [start] = said(first, job, "start")
    runner, child = start["pid"], start["child"]
    assert alive(runner) and alive(child)
    daemon = None
    if keep:
        log = first.state_dir / "keeper.log"
        first.wait_for(lambda: log.exists() and "keeps the channel end of" in log.read_text(),
                       what="the keeper to hold the service's channel")
        [daemon] = [e["pid"] for e in read_jsonl(first.module_data() / "events.jsonl")
                    if e["event"] == "hello"]
    first.kill()
    took = wait_gone([runner, child], GONE_WITHIN_S)
    print(f"\nrunner and its child gone {took:.3f} s after the agent's SIGKILL")
    if keep:
        assert alive(daemon), "the kept service went with the agent"
    # The next agent (without the flag: it ends what the keeper kept) runs the job again:
    # its runner had not finished.
    second = start_agent([mod], {"echo": {"slots": 2}}, state_dir=first.state_dir)
    done = second.wait(job, 60)
    assert done["state"] == "succeeded", second.why(done)
    assert len(said(second, job, "start")) == 2
    second.stop()


def test_finished_attempts_are_collected_unfinished_ones_run_again(
        start_agent: Any, tmp_path: Path) -> None:
    mod = fate_module(tmp_path / "m")
    first = start_agent([mod])
    # Finished (result.json written) but not yet exited; finished with a failure naming its
    # fault; mid-work.
    done = first.submit("plain", {"linger_s": 600})
    failed = first.submit("plain", {"finish": "failure", "linger_s": 600})
    working = first.submit("plain", {"work_s": 600})
    first.wait_for(lambda: bool(said(first, done, "finished") and said(first, failed, "finished")
                                and said(first, working, "start")), what="three runners")
    runners = [said(first, j, "start")[0]["pid"] for j in (done, failed, working)]
    first.kill()
    wait_gone(runners, GONE_WITHIN_S)

    second = start_agent([mod], state_dir=first.state_dir)
    a, b, c = (second.wait(j, 60) for j in (done, failed, working))
    # Collected: the outcome its runner wrote, the runner not started again.
    assert a["state"] == "succeeded", second.why(a)
    assert a["result"]["payload"] == {"attempt": f"{done}.1"}
    assert b["state"] == "failed" and b["reason"] == "told_to_fail: the payload said so", b
    for job in (done, failed):
        assert len(said(second, job, "start")) == 1, notes(second, job)
        rec = job_record(second, job)
        assert rec["attempts"] == 1 and rec["released"] == 0, rec
        [entry] = rec["history"]
        assert entry["attempt_id"] == f"{job}.1" and entry["collected"], entry
    # Not finished: released without charge and run again, once.
    assert c["state"] == "succeeded", second.why(c)
    assert c["result"]["payload"] == {"attempt": f"{working}.2"}
    assert len(said(second, working, "start")) == 2
    rec = job_record(second, working)
    assert [h["outcome"] for h in rec["history"]] == ["released", "succeeded"], rec
    assert not any(h.get("collected") for h in rec["history"])
    st = second.status()
    assert st["jobs_after_restart"] == {"collected": 2, "rerun": 1}, st["jobs_after_restart"]
    rows = {j["job_id"]: j for j in st["jobs"]}
    assert [rows[j]["collected"] for j in (done, failed, working)] == [True, True, False]
    assert "outcome succeeded collected, not run again" in second.log()
    human = second.cli("status", "--state-dir", str(second.state_dir))
    assert "after agent restarts: 2 job(s) collected (their runner had finished), 1 re-run" \
        in human.stdout, human.stdout
    second.stop()
