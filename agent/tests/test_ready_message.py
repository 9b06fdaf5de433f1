"""Readiness said on the channel (contract section 3, ``OARBANK_ENDPOINT_FEATURES=ready``),
through a real agent and the echo service speaking the wire directly: the line makes the
service ready without the ``ready`` op, a service that never says it is polled as before, and a
``ready`` out of place is a protocol violation (a service failure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_helpers import read_jsonl

from oarbank_agent.services import starter


def _events(agent, name: str) -> list[float]:
    return [e["t"] for e in read_jsonl(agent.module_data() / "events.jsonl")
            if e["event"] == name]


def test_a_ready_line_makes_the_service_ready_without_the_op(start_agent,
                                                             echo_module: Path) -> None:
    # never_ready: the `ready` op always answers false, so only the line can make it ready.
    agent = start_agent([echo_module], {"echo": {"never_ready": True, "say_ready": 1,
                                                 "load_s": 0.3}})
    ids = [agent.submit("echo", {"requests": 1}) for _ in range(3)]
    jobs = [agent.wait(j) for j in ids]
    assert [j["state"] for j in jobs] == ["succeeded"] * 3, jobs
    said = _events(agent, "said_ready")
    assert len(said) == 1
    starts = [r["t"] for r in read_jsonl(agent.module_data() / "runs.jsonl")
              if r["event"] == "start"]
    assert len(starts) == 3 and min(starts) > said[0]
    log = agent.log()
    assert "channel test.agent.echo/echo: ready (said on the channel)" in log
    assert "test.agent.echo/echo: starting -> ready (ready)" in log
    row = agent.service_row()
    assert row["ready"] is True and row["error"] is None, row


def test_every_op_of_an_endpoint_service_hears_the_offer(start_agent,
                                                        echo_module: Path) -> None:
    agent = start_agent([echo_module], {"echo": {"say_ready": 1}})
    assert agent.run_job("echo", {"requests": 1})["state"] == "succeeded"
    ops = [e for e in read_jsonl(agent.module_data() / "events.jsonl") if e["event"] == "op"]
    assert {"fingerprint", "start"} <= {e["op"] for e in ops}
    assert all(e["features"] == "ready" for e in ops)


def test_a_service_that_never_says_it_is_polled(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module], {"echo": {"load_s": 0.3}})
    assert agent.run_job("echo", {"requests": 1})["state"] == "succeeded"
    assert not _events(agent, "said_ready")
    hello, ready = _events(agent, "hello")[0], _events(agent, "ready")[0]
    log = read_jsonl(agent.module_data() / "events.jsonl")
    polls = [e["t"] for e in log if e["event"] == "op" and e["op"] == "ready"]
    said_ready = [e["t"] for e in log if e["event"] == "answer" and e["op"] == "ready"
                  and e["ready"]]
    # Polled after the hello, and answered true after the daemon marked itself ready (an
    # op's "op" event is written as it starts, before it reads the marker: its answer's is
    # the one to compare).
    assert polls and min(polls) > hello and said_ready and max(said_ready) > ready
    assert "said on the channel" not in agent.log()


def test_ready_before_hello_fails_the_start(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module], {"echo": {"ready_before_hello": True}})
    agent.submit("echo", {"requests": 1})
    agent.wait_for(lambda: "'ready' before 'hello'" in (agent.service_row()["error"] or ""),
                   timeout=60, what="the start to fail with the protocol violation")
    assert agent.service_row()["ready"] is False


def test_a_second_ready_fails_the_service(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module], {"echo": {"say_ready": 2, "never_ready": True}})
    agent.submit("echo", {"requests": 1})
    agent.wait_for(lambda: "a second 'ready'" in (agent.service_row()["error"] or ""),
                   timeout=60, what="the service to fail with the protocol violation")
    assert "protocol violation: a second 'ready'" in agent.log()


def _poll_starts(until_s: float, *, factory: bool, says_ready: bool = False) -> list[float]:
    """When the `ready` polls start (seconds after the hello), up to ``until_s``."""
    starts, t = [], 0.0
    while t <= until_s:
        starts.append(t)
        t += starter.ready_poll_gap(t, factory=factory, says_ready=says_ready)
    return starts


def test_how_often_the_ready_op_is_polled() -> None:
    gap = starter.ready_poll_gap
    # Tight right after the hello (a fork from the process factory is cheap; a process
    # started directly costs more: a looser floor), then a tenth of the time waited.
    assert gap(0.0, factory=True, says_ready=False) == starter.READY_POLL_MIN_FACTORY_S == 0.02
    assert gap(0.0, factory=False, says_ready=False) == starter.READY_POLL_MIN_S == 0.05
    assert gap(5.0, factory=True, says_ready=False) == pytest.approx(0.5)
    assert gap(600.0, factory=False, says_ready=False) == starter.READY_POLL_MAX_S == 10.0
    # A service that said ready on its channel in an earlier run says it again: the polls
    # are only a fallback, never under a second apart.
    assert gap(0.0, factory=True, says_ready=True) == starter.READY_POLL_FALLBACK_S == 1.0
    assert gap(30.0, factory=True, says_ready=True) == gap(30.0, factory=True, says_ready=False)
    for factory in (True, False):
        starts = _poll_starts(120.0, factory=factory)
        gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
        assert all(b >= a - 1e-9 for a, b in zip(gaps, gaps[1:], strict=False))  # never faster later
        # Ready at any moment t is seen by a poll starting at most max(floor, t / 10) later.
        for a, b in zip(starts, starts[1:], strict=False):
            assert b - a <= max(gap(0.0, factory=factory, says_ready=False), 0.1 * a) + 1e-9
        # A service ready ~50 ms after its hello: the next poll starts within 20 ms (factory).
        if factory:
            assert next(t for t in starts if t >= 0.05) - 0.05 <= 0.02 + 1e-9
    # Every poll is a process start: a minute's load costs about 70 polls from the factory
    # (it was one 25 ms after each poll's end: hundreds), then 6 a minute.
    assert len(_poll_starts(60.0, factory=True)) <= 80
    assert len(_poll_starts(600.0, factory=True)) - len(_poll_starts(60.0, factory=True)) <= 60
    assert len(_poll_starts(60.0, factory=False)) <= 70
    assert len(_poll_starts(60.0, factory=True, says_ready=True)) <= 30


