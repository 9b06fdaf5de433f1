"""``Acceptor.ready()``: ``{"op": "ready"}`` on the channel, at most once, after the hello, and
only where the agent offers it (``OARBANK_ENDPOINT_FEATURES``). The agent's role is played by
``endpoint_helpers.FakeAgent`` over a real socketpair (the real agent's side is tested in
agent/tests/test_ready_message.py)."""

from __future__ import annotations

import os
import socket
import threading

import endpoint_helpers as H  # sdk/tests (conftest.py puts it on the path)
import pytest
from platform_marks import fake_agent  # sdk/tests

from oarbank_sdk import service_endpoint as ep

pytestmark = fake_agent


@pytest.fixture
def agent():
    base = H.open_fds()
    a = H.FakeAgent(channel=True)
    yield a
    a.close()
    extra = H.fds_settle(base)
    assert not extra, f"descriptors leaked: {sorted(extra)}"


def _acceptor(agent: H.FakeAgent, **kw: object) -> ep.Acceptor:
    acc = ep.Acceptor(channel=f"fd:{agent.channel_child.detach()}", **kw)  # type: ignore[arg-type]
    agent.channel_child = None
    return acc


def test_ready_is_said_once_after_the_hello_where_offered(agent) -> None:
    with _acceptor(agent, features="ready") as acc:
        assert acc.ready() is True
        assert agent.wait(lambda: agent.ready_lines == 1 and agent.hello_pids == [os.getpid()])
        assert acc.ready() is False  # at most once
        # Nothing else went out: a connection handed now is accepted as usual.
        job_end, service_end = socket.socketpair()
        agent.send_channel({"op": "connection", "conn": 3, "attempt": "a"}, service_end.fileno())
        service_end.close()
        conn, attempt = acc.accept()
        conn.close()
        job_end.close()
        assert agent.wait(lambda: agent.accepted == [3])
    assert agent.ready_lines == 1 and not agent.bad_lines


def test_nothing_is_said_where_the_agent_did_not_offer_it(agent, monkeypatch) -> None:
    monkeypatch.delenv(ep.FEATURES_ENV, raising=False)
    with _acceptor(agent) as acc:
        assert acc.features == frozenset()
        assert acc.ready() is False
        assert agent.wait(lambda: agent.hello_pids == [os.getpid()])
    agent.close_channel()  # everything the service sent has been read once EOF is
    assert agent.ready_lines == 0


@pytest.mark.parametrize("value,offered", [("ready", True), ("other, ready", True),
                                           ("other", False), ("", False), ("readyish", False)])
def test_the_offer_is_read_from_the_environment(agent, monkeypatch, value, offered) -> None:
    monkeypatch.setenv(ep.FEATURES_ENV, value)
    with _acceptor(agent) as acc:
        assert ("ready" in acc.features) is offered
        assert acc.ready() is offered


def test_ready_from_another_thread_while_accept_blocks(agent) -> None:
    with _acceptor(agent, features="ready") as acc:
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(acc.accept()), daemon=True)
        t.start()
        assert acc.ready() is True
        assert agent.wait(lambda: agent.ready_lines == 1)
        job_end, service_end = socket.socketpair()
        agent.send_channel({"op": "connection", "conn": 1, "attempt": 7}, service_end.fileno())
        service_end.close()
        t.join(30)
        assert len(got) == 1
        conn, attempt = got[0]  # type: ignore[misc]
        assert attempt == 7
        conn.close()
        job_end.close()


def test_ready_on_a_closed_channel_raises_channel_closed(agent) -> None:
    acc = _acceptor(agent, features="ready")
    try:
        assert agent.wait(lambda: agent.hello_pids == [os.getpid()])
        agent.close()  # the agent is gone: its end of the channel closed
        with pytest.raises(ep.ChannelClosed):
            acc.ready()
    finally:
        acc.close()
