"""request() and HTTPConnection against a real service process.

The service is ``endpoint_helpers.py start`` (a module's `start` op: it leaves ``serve`` running
with the channel passed on by ``inherit_channel()``), which runs ``Acceptor`` + ``serve_http``.
The agent role is played by ``endpoint_helpers.FakeAgent``, the test's stand-in for the
agent's broker (integration tests with the real agent live in agent/tests).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import endpoint_helpers as H  # sdk/tests (conftest.py puts it on the path)
import pytest
from platform_marks import fake_agent  # sdk/tests

from oarbank_sdk import service_endpoint as ep
from oarbank_sdk.endpoint import job as endpoint_job

pytestmark = fake_agent


def _read_line(stream, timeout: float) -> str:
    """One line from a pipe, bounded in time (the service is a real process)."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = stream.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no line from the service within {timeout}s (got {buf!r})")
        chunk = os.read(fd, 1)
        if not chunk:
            return buf.decode()
        buf += chunk
    return buf.decode()


def _describe(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "?"


@pytest.fixture
def service(monkeypatch):
    """A service started as the agent starts one, plus a connector for attempt "att-1"."""
    base = H.open_fds()
    agent = H.FakeAgent(channel=True)
    child_fd = agent.channel_child.fileno()
    env = dict(os.environ, OARBANK_ENDPOINT_CHANNEL=f"fd:{child_fd}")
    start = subprocess.Popen(
        [sys.executable, str(Path(H.__file__)), "start"],
        env=env, pass_fds=(child_fd,), stdout=subprocess.PIPE,
        start_new_session=True,  # its own process group, as the agent runs each op
    )
    agent.close_child_end()
    try:
        assert start.wait(30) == 0
        daemon_pid = json.loads(_read_line(start.stdout, 10))["daemon_pid"]
        job_end = agent.open_connector("att-1")
        monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{job_end.detach()}")
        endpoint_job._connector("model")  # adopt it now, as the first connect would
        yield agent, daemon_pid, start
    finally:
        endpoint_job._forget_connectors()
        agent.close()
        try:
            os.killpg(start.pid, signal.SIGKILL)  # the daemon stays in start's group
        except ProcessLookupError:
            pass
        start.stdout.close()
        extra = H.fds_settle(base)
        assert not extra, f"descriptors leaked: {[(fd, _describe(fd)) for fd in sorted(extra)]}"


def test_hello_comes_from_the_daemon_start_left_running(service):
    agent, daemon_pid, _ = service
    assert agent.wait(lambda: agent.hello_pids == [daemon_pid])


def test_request_round_trip_with_receipts(service):
    agent, daemon_pid, _ = service
    r = ep.request("model", "GET", "/v1/info")
    assert r.status == 200
    assert r.headers["content-type"] == "application/json"
    info = r.json()
    # upstream's client_address; the id itself, typed as it came, on the connection (ours)
    assert info == {"pid": daemon_pid, "client": ["attempt-att-1", 0], "attempt": "att-1",
                    "path": "/v1/info", "host": "model"}
    r = ep.request("model", "POST", "/v1/generate", {"prompt": "héllo"})
    assert r.status == 201
    echoed = r.json()
    assert echoed["content_type"] == "application/json"
    assert json.loads(echoed["body"]) == {"prompt": "héllo"}
    r = ep.request("model", "POST", "/raw", "plain text ✓", headers={"Content-Type": "text/plain"})
    assert r.json()["body"] == "plain text ✓" and r.json()["content_type"] == "text/plain"
    assert "plain text" in r.text
    # one brokered connection, kept alive for all three (pooled), receipted on both sides
    assert agent.wait(lambda: agent.received == [1] == agent.accepted)
    assert agent.connect_pids == [os.getpid()]


def test_request_refused_raises_endpoint_error(service):
    agent, _, _ = service
    agent.refusals.append(("service_unavailable", "held: preempt_memory"))
    with pytest.raises(ep.EndpointError) as info:
        ep.request("model", "GET", "/")
    assert info.value.code == "service_unavailable"
    assert info.value.detail == "held: preempt_memory"
    with pytest.raises(TypeError):
        ep.request("model", "POST", "/", body=object())


def test_http_connection_keeps_alive_and_reconnects(service):
    agent, daemon_pid, _ = service
    conn = ep.HTTPConnection("model", timeout=10)
    try:
        for i in range(3):
            conn.request("POST", f"/n/{i}", body=b"x" * i)
            resp = conn.getresponse()
            assert resp.status == 201
            assert json.loads(resp.read())["body"] == "x" * i
        assert len(agent.connect_pids) == 1  # three requests, one connection
        conn.close()
        conn.request("GET", "/again")
        assert json.loads(conn.getresponse().read())["pid"] == daemon_pid
        assert len(agent.connect_pids) == 2  # reconnected through the agent
    finally:
        conn.close()


def test_parallel_requests_from_threads(service):
    agent, _, _ = service
    results: list[int] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            r = ep.request("model", "POST", "/p", {"i": i}, timeout=20)
            results.append(json.loads(r.json()["body"])["i"])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert sorted(results) == list(range(16))


def test_ended_then_channel_eof_ends_the_service(service):
    agent, _, start = service
    conn = ep.HTTPConnection("model", timeout=10)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        assert agent.wait(lambda: agent.accepted == [1])
        # the attempt is over: the service closes what is left of its connections
        agent.send_ended("att-1")
        sock = conn.sock
        sock.settimeout(10)
        assert sock.recv(1) == b""
    finally:
        conn.close()
    # The agent stops the service: channel EOF -> serve_http returns -> the process exits.
    agent.close_channel()
    last = json.loads(_read_line(start.stdout, 10))
    assert last == {"served": "eof", "malformed": 0}
