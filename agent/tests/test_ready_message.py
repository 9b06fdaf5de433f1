"""Readiness said on the channel (contract section 3, ``OARBANK_ENDPOINT_FEATURES=ready``),
through a real agent and the echo service speaking the wire directly: the line makes the
service ready without the ``ready`` op, a service that never says it is polled as before, and a
``ready`` out of place is a protocol violation (a service failure)."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import read_jsonl

from oarbank_agent.services import supervisor


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


def test_how_often_the_ready_op_is_polled() -> None:
    cap = supervisor.ready_poll_cap
    # A fork from the process factory is cheap: polled tightly, so a polled service's first
    # job waits little; a process started directly costs more: a looser cap.
    assert cap(factory=True, says_ready=False) == supervisor.READY_POLL_MAX_FACTORY_S == 0.025
    assert cap(factory=False, says_ready=False) == supervisor.READY_POLL_MAX_S == 0.1
    # A service that said ready on its channel in an earlier run says it again: the polls
    # are only a fallback.
    assert cap(factory=True, says_ready=True) == cap(factory=False, says_ready=True) == 1.0
