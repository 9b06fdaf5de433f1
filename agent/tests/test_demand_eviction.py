"""Demand eviction through real agents: two modules whose services each reserve 0.5 GB of a
0.8 GB budget. The second module's job does not wait out the first's idle_timeout_s (600 s):
the idle service is stopped (``evicted``) and the job starts within that stop, its own
service's load and a second. Under both modules' load at once no service with users is
stopped and none is stopped sooner than its load time after it became ready."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from agent_helpers import PORTAL, job_record, read_jsonl, runner_file, running_portal, write_module

LOAD_S = 1.0
MODS = ("test.agent.a", "test.agent.b")


def two_modules(tmp_path: Path) -> tuple[list[Path], dict[str, Any]]:
    svc = {"reserves_host_memory": True, "idle_timeout_s": 600}
    mods = [write_module(tmp_path / m, module_id=m, service=svc) for m in MODS]
    settings = {m: {"reserve_gb": 0.5, "load_s": LOAD_S} for m in MODS}
    return mods, settings


def events(agent: Any, module: str) -> list[dict[str, Any]]:
    return read_jsonl(agent.state_dir / "modules" / module / "data" / "events.jsonl")


def daemon_lives(evs: list[dict[str, Any]]) -> list[tuple[float, float | None, float | None]]:
    """(start op began, ready, stop op began) of each run of a service, from its events."""
    lives: list[list[float | None]] = []
    for e in evs:
        if e["event"] == "op" and e["op"] == "start":
            lives.append([e["t"], None, None])
        elif e["event"] == "ready" and lives and lives[-1][1] is None:
            lives[-1][1] = e["t"]
        elif e["event"] == "op" and e["op"] == "stop" and lives and lives[-1][2] is None:
            lives[-1][2] = e["t"]
    return [(a, b, c) for a, b, c in lives if a is not None]


def wait_evictable(agent: Any, module: str) -> None:
    """Wait until the module's service has been ready for its load time: sooner, demand
    eviction leaves it alone (no thrash), and a job that needs its room waits for that."""
    def ready_since() -> float | None:
        lives = daemon_lives(events(agent, module))
        return lives[-1][1] if lives else None

    agent.wait_for(lambda: ready_since() is not None, timeout=30, what=f"{module} ready")
    agent.wait_for(lambda: time.time() >= ready_since() + LOAD_S, timeout=LOAD_S + 5,
                   what=f"{module} ready for its load time")


def test_an_idle_service_makes_room_for_the_job_that_waits(start_agent, tmp_path: Path) -> None:
    mods, settings = two_modules(tmp_path)
    agent = start_agent(mods, settings, extra_args=["--memory-budget-gb", "0.8",
                                                    "--gpu-apis", "none"])
    first = agent.run_job("echo", {}, module=MODS[0])
    assert first["state"] == "succeeded", agent.why(first)
    # Not evicted before it has been ready for its own load time (no thrash): the job below
    # is timed from when the service may be evicted.
    wait_evictable(agent, MODS[0])
    job = agent.submit("echo", {}, module=MODS[1])
    done = agent.wait(job, timeout=60)
    assert done["state"] == "succeeded", agent.why(done)
    # The wait is the agent's: submitted -> its runner launched, from the job's record (the
    # runner's own interpreter start, a second or more on a loaded machine, is not a wait
    # eviction can shorten).
    rec = job_record(agent, job)
    a_life = daemon_lives(events(agent, MODS[0]))[-1]
    b_life = daemon_lives(events(agent, MODS[1]))[-1]
    assert a_life[2] is not None and b_life[1] is not None
    stop_s = b_life[0] - a_life[2]  # the idle service's stop op began -> the next start began
    load_s = b_life[1] - b_life[0]
    wait_s = rec["started_at"] - rec["submitted_at"]
    print(f"second job waited {wait_s:.2f}s (stop {stop_s:.2f}s, load {load_s:.2f}s)")
    assert wait_s <= stop_s + load_s + 1.0
    assert wait_s < 2 * LOAD_S + 5  # not idle_timeout_s (600 s)
    row = next(r for r in agent.status()["services"] if r["module"] == MODS[0])
    assert row["running"] is False and row["last_stop_reason"] == "evicted"
    assert row["evicted_for"] == f"job {job} of module {MODS[1]}"
    assert f"to make room for job {job} of module {MODS[1]}" in agent.log()
    table = agent.cli("status", "--state-dir", str(agent.state_dir)).stdout
    assert f"EVICTED {MODS[0]}/echo: to make room for job {job} of module {MODS[1]}" in table
    stats = json.loads((agent.state_dir / "service_stats.json").read_text())
    assert stats[f"{MODS[0]}/echo"]["loads"] == 1
    assert LOAD_S <= stats[f"{MODS[0]}/echo"]["load_s"] < LOAD_S + 5


def test_under_both_modules_load_none_with_users_is_evicted_and_none_flaps(
        start_agent, tmp_path: Path) -> None:
    mods, settings = two_modules(tmp_path)
    agent = start_agent(mods, settings, extra_args=["--memory-budget-gb", "0.8",
                                                    "--gpu-apis", "none"])
    ids = [agent.submit("echo", {"sleep_s": 0.3}, module=MODS[i % 2]) for i in range(8)]
    ids += [agent.submit("echo", {"sleep_s": 0.3}, module=MODS[0]) for _ in range(3)]
    jobs = [agent.wait(j, timeout=120) for j in ids]
    assert all(j["state"] == "succeeded" and j["attempts"] == 1 for j in jobs), \
        agent.why(next(j for j in jobs if j["state"] != "succeeded" or j["attempts"] != 1))
    runs = {r["attempt"]: r for r in read_jsonl(agent.state_dir / "modules" / MODS[0] / "data"
                                                / "runs.jsonl") if r["event"] == "end"}
    assert len(runs) == len(ids)
    lives = {m: daemon_lives(events(agent, m)) for m in MODS}
    print("loads per module:", {m: len(v) for m, v in lives.items()})
    for m, mine in lives.items():
        for began, ready, stop in mine:
            assert ready is not None
            # none flaps: it ran at least its load time once ready before it was stopped
            if stop is not None:
                assert stop - ready >= LOAD_S - 0.05, (m, began, ready, stop)
    # the budget holds one model at a time: the two never ran at once
    spans = sorted((b, s if s is not None else float("inf"), m)
                   for m, mine in lives.items() for b, _, s in mine)
    for (_, end1, m1), (b2, _, m2) in zip(spans, spans[1:], strict=False):
        assert b2 >= end1, f"{m1} and {m2} ran at once"
    # no service was stopped while it had users: every attempt ran inside one life of its
    # module's service
    for j in jobs:
        rec = read_jsonl(runner_file(agent, f"{j['job_id']}.1", "runs.jsonl"))
        start = next(r["t"] for r in rec if r["event"] == "start")
        end = next(r["t"] for r in rec if r["event"] == "end")
        mine = lives[j["module"]]
        assert any(ready is not None and ready <= start and (stop is None or end <= stop)
                   for _, ready, stop in mine), (j, mine)
    assert "evicting it" in agent.log()


def test_the_portal_shows_the_service_was_evicted(start_agent, tmp_path: Path) -> None:
    mods, settings = two_modules(tmp_path)
    with running_portal(tmp_path) as portal:
        token = tmp_path / "portal.token"
        token.touch(mode=0o600)
        issued = subprocess.run([*PORTAL, "token", "issue", "test-node", "--db",
                                 str(portal["db"])], capture_output=True, text=True, timeout=60)
        assert issued.returncode == 0, issued.stderr
        token.write_text(issued.stdout.strip() + "\n")
        agent = start_agent(mods, settings, extra_args=[
            "--memory-budget-gb", "0.8", "--gpu-apis", "none", "--portal", portal["url"],
            "--portal-token-file", str(token), "--heartbeat-s", "0.3"])
        assert agent.run_job("echo", {}, module=MODS[0])["state"] == "succeeded"
        wait_evictable(agent, MODS[0])
        job = agent.submit("echo", {}, module=MODS[1])
        assert agent.wait(job, timeout=60)["state"] == "succeeded"
        hb = next(r for r in agent.status()["services"] if r["module"] == MODS[0])
        assert hb["evicted_for"] == f"job {job} of module {MODS[1]}"

        def row() -> dict[str, Any]:
            url = f"{portal['url']}/v1/queries/services?module={MODS[0]}"
            with urllib.request.urlopen(url, timeout=10) as r:
                (only,) = json.loads(r.read())
            return only  # type: ignore[no-any-return]

        agent.wait_for(lambda: row()["stopped_reason"] == "evicted", timeout=30,
                       what="the portal's services query answering evicted")
        assert row()["state"] == "stopped"
        agent.stop()
