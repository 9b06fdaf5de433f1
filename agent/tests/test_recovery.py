"""`kill -9` the agent at any moment: the next `oarbank-agent run` on the same state dir ends
what its predecessor left (never adopting an endpoint service), adopts a running non-endpoint
service, gives interrupted attempts back without charge, and every job finishes, none run
twice at once."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import alive, job_record, processes_referencing, read_jsonl, write_module

MOD = "test.agent.echo"


@pytest.fixture(autouse=True)
def reap_on_failure(tmp_path: Path) -> Iterator[None]:
    """A killed agent's children outlive it; if a test fails before a second agent ends them,
    end them here (they are this test's processes: they reference its tmp dir)."""
    yield
    for line in processes_referencing(tmp_path):
        pid = int(line.split(":", 1)[0])
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def events(agent: Any, kind: str) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(agent.module_data() / "events.jsonl") if e["event"] == kind]


def runs(agent: Any) -> list[dict[str, Any]]:
    return read_jsonl(agent.module_data() / "runs.jsonl")


def test_kill_while_serving_jobs_every_job_finishes_once(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    # linger_after_eof: a daemon that outlives its channel, so the restart has to end it.
    first = start_agent([mod], {"echo": {"slots": 2, "linger_after_eof": True}})
    jobs = [first.submit("echo", {"requests": 2, "sleep_s": 3.0, "sleep_below_attempt": 2})
            for _ in range(6)]
    first.wait_for(lambda: len([r for r in runs(first) if r["event"] == "sleep"]) >= 2,
                   what="two runners at work")
    (old_daemon,) = [e["pid"] for e in events(first, "hello")]
    killed_runners = [r["pid"] for r in runs(first) if r["event"] == "start"]
    first.kill()
    t_restart = time.time()
    second = start_agent([mod], {"echo": {"slots": 2}}, state_dir=first.state_dir)
    recs = [second.wait(j, 120) for j in jobs]
    assert [r["state"] for r in recs] == ["succeeded"] * 6, recs
    # The predecessor's runners and its endpoint service were ended, not adopted.
    assert not any(alive(p) for p in killed_runners + [old_daemon])
    hellos = events(second, "hello")
    assert len(hellos) == 2 and hellos[1]["pid"] != old_daemon
    new_ready = hellos[1]["t"]
    print(f"\nkill -9 restart: service ready again {new_ready - t_restart:.2f}s after the "
          "second agent was launched")
    # Interrupted attempts were given back: no job was charged for the crash.
    for job in jobs:
        rec = job_record(second, job)
        assert rec["attempts"] == 1, rec
        assert rec["released"] == len([h for h in rec["history"] if h["outcome"] == "released"])
    # None ran twice at once: every attempt of a job started after the previous one ended
    # (a killed attempt has no `end`: it ended before the second agent ran anything).
    starts = {r["attempt"]: r["t"] for r in runs(second) if r["event"] == "start"}
    for job in jobs:
        mine = sorted(t for a, t in starts.items() if a.startswith(job + "."))
        if len(mine) > 1:
            assert mine[-1] > t_restart
    log = second.log()
    first_runner = min(t for a, t in starts.items() if t > t_restart)
    assert "ended a process group left by a previous agent" in log
    assert "endpoint service, never adopted" in log
    assert first_runner > t_restart


def test_kill_while_the_service_starts(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    first = start_agent([mod], {"echo": {"load_s": 30}})
    job = first.submit("echo", {"requests": 1})
    first.wait_for(lambda: events(first, "hello"), what="the daemon loading")
    (loading,) = [e["pid"] for e in events(first, "hello")]
    first.kill()
    second = start_agent([mod], {"echo": {"load_s": 0.2}}, state_dir=first.state_dir)
    rec = second.wait(job, 60)
    assert (rec["state"], rec["attempts"]) == ("succeeded", 1), rec
    assert not alive(loading)
    assert [e["pid"] for e in events(second, "hello")][-1] != loading


def test_kill_while_it_stops(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"idle_timeout_s": 0.2, "stop_timeout_s": 60})
    first = start_agent([mod], {"echo": {"stop_hang": True}})
    assert first.run_job("echo", {"requests": 1})["state"] == "succeeded"
    first.wait_for(lambda: events(first, "stop_hang"), what="the stop op to hang")
    (daemon,) = [e["pid"] for e in events(first, "hello")]
    (stop_op,) = [e["pid"] for e in events(first, "stop_hang")]
    first.kill()
    # Settings given explicitly: without them the state dir keeps stop_hang (never rewritten).
    second = start_agent([mod], {"echo": {}}, state_dir=first.state_dir)
    assert not alive(daemon) and not alive(stop_op)
    assert second.run_job("echo", {"requests": 1})["state"] == "succeeded"


def test_running_non_endpoint_service_is_adopted_not_started_twice(start_agent,
                                                                   tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"lifecycle": "always", "endpoint": False})
    first = start_agent([mod])
    first.wait_for(lambda: first.service_row()["ready"], what="ready")
    (daemon,) = [e["pid"] for e in events(first, "daemon")]
    first.kill()
    starts_before = len([e for e in events(first, "op") if e["op"] == "start"])
    second = start_agent([mod], state_dir=first.state_dir)
    row = second.service_row()
    assert (row["ready"], row["running"], row["error"]) == (True, True, None), row
    assert alive(daemon)
    assert len([e for e in events(second, "op") if e["op"] == "start"]) == starts_before
    assert "adopted (fingerprint says running; process group" in second.log()
    assert second.run_job("echo", {})["state"] == "succeeded"
    # Adopted means watched: its group dying is noticed and the restart policy applies.
    (second.module_data() / "die_now").touch()
    second.wait_for(lambda: len(events(second, "daemon")) == 2, what="a new daemon")
    assert not alive(daemon)
    second.stop()  # its stop order ends the new daemon; nothing is left (asserted by stop)


def test_non_endpoint_service_that_died_meanwhile_is_started_anew(start_agent,
                                                                  tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={"endpoint": False, "idle_timeout_s": 60})
    first = start_agent([mod])
    assert first.run_job("echo", {})["state"] == "succeeded"
    (daemon,) = [e["pid"] for e in events(first, "daemon")]
    first.kill()
    os.kill(daemon, signal.SIGKILL)
    second = start_agent([mod], state_dir=first.state_dir)
    assert second.service_row()["running"] is False
    assert second.run_job("echo", {})["state"] == "succeeded"
    assert len(events(second, "daemon")) == 2
