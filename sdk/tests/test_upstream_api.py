"""``oarbank_sdk.service_endpoint`` is a superset of upstream's public API (contract section 3):
one test per row of the table in sdk/README.md ("Upstream's API on ours").

The service is a real process written with upstream's names and keywords only (``SERVICE``
below); the agent's role is played by ``endpoint_helpers.FakeAgent`` over real socketpairs and
SCM_RIGHTS, which lets a test choose the attempt ids (integers, as agents send them, or strings,
as older ones did).
"""

from __future__ import annotations

import inspect
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import endpoint_helpers as H  # sdk/tests (conftest.py puts it on the path)
import pytest

from oarbank_sdk import service_endpoint as ep
from oarbank_sdk.endpoint import job as endpoint_job

# A service written against upstream's API: keywords as upstream names them.
SERVICE = r'''
import json, os, subprocess, sys
from http.server import BaseHTTPRequestHandler
from oarbank_sdk import service_endpoint as ep

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        attempt = self.client_address[1]
        child = subprocess.run([sys.executable, "-c",
                                "import os; print(os.environ.get('OARBANK_ENDPOINT_CHANNEL'))"],
                               capture_output=True, text=True).stdout.strip()
        body = json.dumps({"attempt": attempt, "attempt_type": type(attempt).__name__,
                           "env": os.environ.get("OARBANK_ENDPOINT_CHANNEL"),
                           "child_env": child}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Mixed-Case", "yes")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

if sys.argv[1] == "start":
    proc = subprocess.Popen([sys.executable, __file__, "serve"], **ep.inherit_channel())
    print(json.dumps({"ok": True, "daemon_pid": proc.pid}), flush=True)
else:
    acc = ep.Acceptor(max_per_attempt=2)
    ep.serve_http(handler=Handler, acceptor=acc)
'''


def _read_line(stream, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream.fileno()], [], [], left)[0]:
            raise AssertionError(f"no line from the service within {timeout}s (got {buf!r})")
        chunk = os.read(stream.fileno(), 1)
        if not chunk:
            break
        buf += chunk
    return buf.decode()


@pytest.fixture
def service(tmp_path, monkeypatch):
    """The upstream-style service, started as an agent starts one; connectors for attempt 7
    (an integer, as agents send) as "model" and "att-2" (a string) as "other"."""
    base = H.open_fds()
    prog = tmp_path / "upstream_style_service.py"
    prog.write_text(SERVICE)
    agent = H.FakeAgent(channel=True)
    child_fd = agent.channel_child.fileno()
    env = dict(os.environ, OARBANK_ENDPOINT_CHANNEL=f"fd:{child_fd}")
    start = subprocess.Popen([sys.executable, str(prog), "start"], env=env,
                             pass_fds=(child_fd,), stdout=subprocess.PIPE,
                             start_new_session=True)
    agent.close_child_end()
    try:
        assert start.wait(30) == 0
        daemon_pid = json.loads(_read_line(start.stdout, 10))["daemon_pid"]
        assert agent.wait(lambda: agent.hello_pids == [daemon_pid])
        monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{agent.open_connector(7).detach()}")
        monkeypatch.setenv("OARBANK_SERVICE_OTHER", f"fd:{agent.open_connector('att-2').detach()}")
        for name in ("model", "other"):
            endpoint_job._connector(name)  # adopt them now: teardown closes them
        yield agent
    finally:
        endpoint_job._forget_connectors()
        agent.close()
        try:
            os.killpg(start.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        start.stdout.close()
        extra = H.fds_settle(base)
        assert not extra, f"descriptors leaked: {sorted(extra)}"


def _params(fn) -> dict[str, object]:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()}


# --- job side --------------------------------------------------------------------------------


def test_available_says_whether_the_attempt_has_a_connector(service, monkeypatch):
    assert ep.available("model") is True
    monkeypatch.delenv("OARBANK_SERVICE_NONE", raising=False)
    assert ep.available("none") is False
    r, w = os.pipe()
    try:
        monkeypatch.setenv("OARBANK_SERVICE_PIPE", f"fd:{r}")  # open, but not a stream socket
        assert ep.available("pipe") is False
    finally:
        os.close(r)
        os.close(w)
    monkeypatch.setenv("OARBANK_SERVICE_GONE", f"fd:{r}")  # closed now
    assert ep.available("gone") is False
    monkeypatch.setenv("OARBANK_SERVICE_JUNK", "handle:12")
    assert ep.available("junk") is False


def test_request_takes_upstreams_parameters_and_600_s_default(service):
    assert _params(ep.request) == {"service": inspect.Parameter.empty,
                                   "method": inspect.Parameter.empty,
                                   "path": inspect.Parameter.empty, "body": None,
                                   "headers": None, "timeout": 600.0}
    r = ep.request(service="model", method="GET", path="/", body=None, headers=None)
    assert r.status == 200 and r.json()["attempt"] == 7


def test_response_headers_answer_lower_case_names(service):
    r = ep.request("model", "GET", "/")
    assert r.headers["x-mixed-case"] == "yes" and r.headers["X-Mixed-Case"] == "yes"
    assert r.headers.get("content-type") == "application/json"
    names = list(r.headers.keys())
    assert names and all(n == n.lower() for n in names), names
    assert dict(r.headers.items())["x-mixed-case"] == "yes"
    assert isinstance(r.body, bytes) and r.json()["attempt_type"] == "int"


def test_http_connection_defaults_to_no_timeout_and_keeps_alive(service):
    assert _params(ep.HTTPConnection) == {"service": inspect.Parameter.empty, "timeout": None}
    conn = ep.HTTPConnection("model")
    try:
        assert conn.timeout is None
        for _ in range(2):
            conn.request("GET", "/")
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["attempt"] == 7
    finally:
        conn.close()
    assert service.wait(lambda: len(service.received) == 1)  # one brokered connection


def test_endpoint_error_is_a_runtime_error_with_code_and_detail(service):
    assert issubclass(ep.EndpointError, RuntimeError)
    service.refusals.append(("service_unavailable", "not ready"))
    with pytest.raises(RuntimeError) as info:
        ep.request("model", "GET", "/")
    assert isinstance(info.value, ep.EndpointError)
    assert (info.value.code, info.value.detail) == ("service_unavailable", "not ready")


def test_a_closed_connector_raises_code_closed(fd_pair):
    agent_end, monkeypatch = fd_pair
    agent_end.shutdown(socket.SHUT_RDWR)
    with pytest.raises(ep.EndpointError) as info:
        ep.connect("model", timeout=5)
    assert info.value.code == "closed"
    assert isinstance(info.value, ep.ChannelClosed)  # ours: a subclass to catch it by type


@pytest.fixture
def fd_pair(monkeypatch):
    base = H.open_fds()
    agent_end, job_end = socket.socketpair()
    monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{job_end.detach()}")
    yield agent_end, monkeypatch
    endpoint_job._forget_connectors()
    agent_end.close()
    assert not H.fds_settle(base)


# --- service side ------------------------------------------------------------------------------


def test_acceptor_yields_the_attempt_id_as_it_came(service):
    assert ep.request("model", "GET", "/").json()["attempt"] == 7  # integer in, integer out
    r = ep.request("other", "GET", "/").json()
    assert (r["attempt"], r["attempt_type"]) == ("att-2", "str")


def test_acceptor_max_per_attempt_caps_open_connections(service):
    assert _params(ep.Acceptor)["max_per_attempt"] == 64
    # The service runs Acceptor(max_per_attempt=2): a third connection cuts the oldest.
    socks = [ep.connect("model", timeout=5) for _ in range(3)]
    try:
        socks[0].settimeout(5)
        assert socks[0].recv(1) == b""  # cut by the service
        socks[2].sendall(b"GET / HTTP/1.1\r\nHost: model\r\nConnection: close\r\n\r\n")
        socks[2].settimeout(5)
        head = b""
        while len(head) < 12 and (chunk := socks[2].recv(12 - len(head))):
            head += chunk
        assert head == b"HTTP/1.1 200"  # the newest still served
    finally:
        for s in socks:
            s.close()
    with pytest.raises(ValueError, match="max_per_attempt must be a positive integer, got 0"):
        ep.Acceptor(0)


def test_serve_http_and_inherit_channel_take_upstreams_names():
    assert list(_params(ep.serve_http)) == ["handler", "acceptor"]
    assert _params(ep.serve_http)["acceptor"] is None
    assert _params(ep.inherit_channel) == {}


def test_the_channel_variable_leaves_the_environment_once_the_acceptor_holds_it(service):
    r = ep.request("model", "GET", "/").json()
    assert r["env"] is None  # the daemon's own os.environ
    assert r["child_env"] == "None"  # and so its children do not inherit the name


def test_our_additions_are_kept():
    for name in ("connect", "inherit_connector", "env_name", "EndpointSocket", "ChannelClosed",
                 "Response", "CHANNEL_ENV", "CONNECTIONS_PER_ATTEMPT", "REQUEST_TIMEOUT_S"):
        assert name in ep.__all__ and hasattr(ep, name), name
    assert "channel" in inspect.signature(ep.Acceptor).parameters  # keyword-only, ours
    assert inspect.signature(ep.Acceptor).parameters["channel"].kind is inspect.Parameter.KEYWORD_ONLY
    assert hasattr(ep.Acceptor, "__enter__") and hasattr(ep.Acceptor, "open_connections")
    assert _params(ep.connect) == {"service": inspect.Parameter.empty, "timeout": None}
