"""The agent's side of the runner protocol's control document, with real agents and a real
runner that uses ``oarbank_sdk.control`` (modfiles/control_runner.py; it declares
``cancellable``, ``cooperative_pause`` and ``checkpoint``): paused under real memory pressure
and resumed when it ends; stopped at a safe point by a drain and resumed from its checkpoint
by the next agent, each unit of work done once; released by a host rule, the runner that
acknowledges gone at once, the one that never does ended only at the grace.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import MODFILES, job_record, read_jsonl, write_module
from test_memory_pressure import GiB, floor_args, hog
from test_protect_rules import protect

from testsupport import memhog

MODULE = "test.agent.ctl"
CAPS = ["cancellable", "cooperative_pause", "checkpoint"]


def control_module(root: Path, *, with_service: bool = False) -> Path:
    stages = [{"name": "work", "timeout_s": 120,
               **({"requires": {"pools": {"echo": 1}}} if with_service else {})}]
    write_module(root, module_id=MODULE, with_service=with_service, stages=stages,
                 runner={"exec": ["python", "-I", "{bundle}/control_runner.py"],
                         "capabilities": CAPS, "stop_grace_s": 2})
    shutil.copy(MODFILES / "control_runner.py", root / "control_runner.py")
    return root


def workdir(agent: Any, job: str, n: int = 1) -> Path:
    return agent.state_dir / "jobs" / job / f"a{n}"


def chunks(agent: Any, job: str, n: int = 1) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(workdir(agent, job, n) / "work.jsonl") if "chunk" in r]


def doc(agent: Any, job: str, n: int = 1) -> dict[str, Any]:
    try:
        return json.loads((workdir(agent, job, n) / "control.json").read_text())
    except (OSError, ValueError):
        return {}


@pytest.mark.xdist_group(memhog.XDIST_GROUP)
def test_memory_pressure_pauses_a_cooperative_job_and_its_end_resumes_it(
        start_agent, tmp_path: Path) -> None:
    # The job forges its control.json: a link to a file outside its workdir saying "stop".
    victim = tmp_path / "victim.json"
    forged = json.dumps({"seq": 1000, "stop": True, "pause": False})
    victim.write_text(forged)
    args, target = floor_args(soft_below=2.5 * GiB, hard_below=None, margin=0.2 * GiB)
    agent = start_agent([control_module(tmp_path / "m")], extra_args=args)
    job = agent.submit("work", {"chunks": 300, "chunk_s": 0.05, "forge_control": str(victim)},
                       module="ctl")
    agent.wait_for(lambda: len(chunks(agent, job)) >= 5, what="the job working")
    assert (workdir(agent, job) / "control.json").is_symlink()  # the forgery is in place
    with hog(target) as h:
        crossed = h.event()
        assert crossed["event"] == "crossed", crossed
        agent.wait_for(lambda: doc(agent, job).get("pause") is True, timeout=30,
                       what="the agent's pause")
        seen_paused = time.time()
        time.sleep(3.0)  # held: no unit of work meanwhile
        during = chunks(agent, job)
        assert during[-1]["t"] < seen_paused + 0.2, "the runner went on working while paused"
        state = next(j for j in agent.status()["jobs"] if j["job_id"] == job)
        assert state["state"] == "running" and state["released"] == 0, state
    done = agent.wait(job, timeout=60)
    assert done["state"] == "succeeded", agent.why(done)
    rec = job_record(agent, job)
    assert (rec["attempts"], rec["released"]) == (1, 0)  # paused, never stopped nor charged
    work = chunks(agent, job)
    assert [r["chunk"] for r in work] == list(range(300))
    # The runner's own notes, each once resumed: when it began holding (at its next safe
    # point) and for how long. (A shared machine's memory may dip again after the test's own
    # pressure: a second hold is counted like the first.)
    holds = [r for r in read_jsonl(workdir(agent, job) / "work.jsonl") if "held_s" in r]
    # the hold the test's pressure caused: the first one still held when it crossed (memory
    # the suite's other tests take may have paused the job a moment before: latency 0 then)
    hold = next(h for h in holds if h["t"] > crossed["t"])
    latency = max(0.0, hold["t"] - hold["held_s"] - crossed["t"])
    assert latency < 2.0, latency  # a sample (0.2 s) and a unit (0.05 s), loaded machine
    assert hold["held_s"] >= 3.0, holds
    # paused_s: the agent's count (the job record, the attempt's entry) and the runner's own
    # (Control.paused_s, in its result): the agent's from its pause to its resume, the
    # runner's from its safe point to the nudge, a little less. Both clocks stop after the
    # same resume nudge, the runner's once it is scheduled: it may end a few ms later (CI
    # under the darwin profile: 3.42697 s against the runner's 3.42713 s).
    runner_paused = done["result"]["payload"]["paused_s"]
    assert round(rec["paused_s"], 3) == rec["history"][0]["paused_s"]
    assert abs(runner_paused - sum(h["held_s"] for h in holds)) < 0.01, (runner_paused, holds)
    pauses = agent.log().count(f"job {job} paused (memory pressure")  # the agent's
    assert pauses >= len(holds) >= 1
    assert -0.05 <= rec["paused_s"] - runner_paused < 0.5 * pauses, (rec["paused_s"], holds)
    # Bad input: the forged document was never read back nor written through.
    assert victim.read_text() == forged
    final = workdir(agent, job) / "control.json"
    assert not final.is_symlink()
    # the agent's own count: 0, then paused and resumed for each hold
    assert json.loads(final.read_text())["seq"] == 2 * pauses
    print(f"\npause latency (crossed -> runner held): {latency:.2f} s; {pauses} pause(s); "
          f"paused_s agent {rec['paused_s']:.2f} s, runner {runner_paused:.2f} s")


def test_a_drain_stops_the_job_at_a_safe_point_and_the_next_agent_resumes_its_checkpoint(
        start_agent, tmp_path: Path) -> None:
    mod = control_module(tmp_path / "m")
    agent = start_agent([mod], extra_args=["--drain-s", "30"])
    job = agent.submit("work", {"chunks": 40, "chunk_s": 0.1}, module="ctl")
    agent.wait_for(lambda: len(chunks(agent, job)) >= 5, what="the job working")
    t0 = time.monotonic()
    agent.stop()  # SIGTERM: the drain asks the runner to stop, it checkpoints and says so
    drained = time.monotonic() - t0
    assert drained < 15, drained  # not the 30 s --drain-s: the runner stopped when asked
    rec = job_record(agent, job)
    assert (rec["state"], rec["attempts"], rec["released"]) == ("queued", 0, 1), rec
    first = rec["history"][-1]
    assert first["outcome"] == "released" and first["stop"] == "acknowledged", first
    assert first["reason"].startswith("drain (SIGTERM); asked to stop at a safe point: "
                                      "acknowledged"), first
    stopped_at = next(r["stopped_at"] for r in read_jsonl(workdir(agent, job) / "work.jsonl")
                      if "stopped_at" in r)
    assert 5 <= stopped_at < 40
    again = start_agent([mod], state_dir=agent.state_dir)
    done = again.wait(job, timeout=60)
    assert done["state"] == "succeeded", again.why(done)
    assert done["attempts"] == 1  # the stopped attempt was not charged
    assert done["result"]["payload"]["resumed_at"] == stopped_at
    assert done["result"]["payload"]["done_here"] == 40 - stopped_at
    second = job_record(again, job)["history"][-1]
    assert second["resumed_from_attempt"] == 1, second
    assert second["resume_digest"].startswith("sha256:") and len(second["resume_digest"]) == 71
    # Work done counted once: every unit in exactly one of the two attempts.
    done_units = [r["chunk"] for n in (1, 2) for r in chunks(again, job, n)]
    assert sorted(done_units) == list(range(40)), done_units
    print(f"\ndrain with a cooperative runner: {drained:.2f} s (--drain-s 30); stopped at unit "
          f"{stopped_at}, resumed there")


def test_a_release_asks_first_and_ends_a_runner_that_never_acknowledges_at_the_grace(
        start_agent, tmp_path: Path) -> None:
    grace = 2.0
    agent = start_agent([control_module(tmp_path / "m", with_service=True)],
                        extra_args=["--release-grace-s", str(grace)])
    # deaf: its first attempt never reaches a safe point, so it ignores the stop.
    deaf = agent.submit("work", {"chunks": 120, "chunk_s": 0.05, "deaf_below_attempt": 2},
                        module="ctl")
    polite = agent.submit("work", {"chunks": 120, "chunk_s": 0.05}, module="ctl")
    agent.wait_for(lambda: len(chunks(agent, deaf)) >= 5 and len(chunks(agent, polite)) >= 5,
                   what="both jobs working")
    protect(agent, "--evict")  # the service is held: its users are released
    agent.wait_for(lambda: doc(agent, deaf).get("stop") and doc(agent, polite).get("stop"),
                   timeout=10, what="both asked to stop")
    # when the agent wrote each stop
    asked, asked_polite = (workdir(agent, j).joinpath("control.json").stat().st_mtime
                           for j in (deaf, polite))
    agent.wait_for(lambda: all(j["state"] == "queued" for j in agent.status()["jobs"]),
                   timeout=grace + 10, what="both released")
    polite_end = read_jsonl(workdir(agent, polite) / "work.jsonl")[-1]
    assert "stopped_at" in polite_end and polite_end["t"] - asked_polite < 1.0, polite_end
    # The deaf one worked on through the grace and was ended then, not before.
    deaf_last = chunks(agent, deaf)[-1]["t"]
    assert deaf_last >= asked + grace - 0.3, (deaf_last - asked)
    deaf_entry = job_record(agent, deaf)["history"][-1]
    assert deaf_entry["finished_at"] - asked < grace + 2.0 + 1.0, deaf_entry
    assert deaf_entry["stop"] == "killed at the grace", deaf_entry
    assert deaf_entry["reason"].startswith(
        "preempt_protection; asked to stop at a safe point, it had not within 2s: ended")
    assert job_record(agent, polite)["history"][-1]["stop"] == "acknowledged"
    protect(agent, "--end-evict")
    done = {j: agent.wait(j, timeout=60) for j in (deaf, polite)}
    assert all(d["state"] == "succeeded" for d in done.values()), done
    # Neither release was charged; the polite one resumed from the checkpoint its stop wrote.
    assert [(job_record(agent, j)["attempts"], job_record(agent, j)["released"])
            for j in (deaf, polite)] == [(1, 1), (1, 1)]
    assert "resumed_from_attempt" not in job_record(agent, deaf)["history"][-1]
    assert job_record(agent, polite)["history"][-1]["resumed_from_attempt"] == 1
    assert done[deaf]["result"]["payload"]["resumed_at"] == 0
    print(f"\nrelease: acknowledged in {polite_end['t'] - asked_polite:.2f} s; the deaf runner "
          f"ended {deaf_entry['finished_at'] - asked:.2f} s after the stop (grace {grace:g} s)")
