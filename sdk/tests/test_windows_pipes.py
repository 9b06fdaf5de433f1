"""``handle:<n>`` on Windows: pipe pairs, duplicated handles, handle lists, HTTP over pipes.

Windows only: here they run under Wine with Windows' own CPython (``nox -s windows``,
harness/nodes/wine.py; harness/tests/test_wine.py runs this file so from the Linux suite), and on
real Windows in the ``windows-latest`` workflow job.

``Broker`` is THE TEST'S STAND-IN FOR THE AGENT's Windows broker: it answers ``connect`` with
a fresh pipe pair, duplicating one end into the job's process (named by the connect's pid,
refused ``bad_pid`` when that is not the child it started) and the other into the service
(this process), as contract section 3 says. It speaks the wire by hand over ``_winapi``, so
the SDK's stream code is not tested against itself.

What Wine does not show, so these tests cannot either: Windows serialising I/O on a
synchronous handle (a write waits behind a blocked read: the SDK's reads peek so that never
happens), and ``IsProcessInJob`` with only ``PROCESS_QUERY_LIMITED_INFORMATION``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "win32",
    reason="Windows pipe handles: run under Wine by `nox -s windows`, or on Windows")

if sys.platform == "win32":
    import _winapi

    from oarbank_sdk import service_endpoint as ep
    from oarbank_sdk._transport import UnsupportedHandle, current

PROCESS_DUP_HANDLE = 0x0040
DUPLICATE_SAME_ACCESS = 0x2


class Line:
    """One agent-side end, read and written with _winapi by hand."""

    def __init__(self, handle: int) -> None:
        self.handle = handle
        self.buf = b""

    def send(self, msg: dict) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode() + b"\n"
        _winapi.WriteFile(self.handle, data)

    def read(self) -> dict | None:
        while b"\n" not in self.buf:
            try:
                data, _ = _winapi.ReadFile(self.handle, 4096)
            except BrokenPipeError:
                return None
            if not data:
                return None
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def close(self) -> None:
        _winapi.CloseHandle(self.handle)


def duplicate_into(pid: int, handle: int) -> int:
    """``handle`` (ours, closed here) as a handle value of process ``pid``."""
    target = _winapi.OpenProcess(PROCESS_DUP_HANDLE, False, pid)
    try:
        return _winapi.DuplicateHandle(_winapi.GetCurrentProcess(), handle, target, 0, False,
                                       DUPLICATE_SAME_ACCESS | 0x1)  # | DUPLICATE_CLOSE_SOURCE
    finally:
        _winapi.CloseHandle(target)


class Broker(threading.Thread):
    """Stand-in for the agent (module docstring): one connector, one service channel."""

    def __init__(self, connector: Line, channel: Line, job_pid: int) -> None:
        super().__init__(daemon=True)
        self.connector, self.channel, self.job_pid = connector, channel, job_pid
        self.conns = 0
        self.seen: list[dict] = []

    def run(self) -> None:
        t = current()
        while (msg := self.connector.read()) is not None:
            self.seen.append(msg)
            if msg.get("op") != "connect":
                continue
            if msg.get("pid") != self.job_pid:
                self.connector.send({"ok": False, "error": "bad_pid",
                                     "detail": f"pid {msg.get('pid')} is not in the attempt"})
                continue
            self.conns += 1
            job_end, svc_end = t.pair()
            self.connector.send({"ok": True, "conn": self.conns,
                                 "handle": duplicate_into(self.job_pid, job_end.detach())})
            assert self.connector.read() == {"op": "received", "conn": self.conns}
            self.channel.send({"op": "connection", "conn": self.conns, "attempt": 7,
                               "handle": duplicate_into(os.getpid(), svc_end.detach())})
            assert self.channel.read() == {"op": "accepted", "conn": self.conns}


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        out = json.dumps({"got": body.decode(), "attempt": self.connection.attempt}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: object) -> None:
        pass


JOB = r"""
import sys
from oarbank_sdk import service_endpoint as ep
for i in range(5):
    r = ep.request("model", "POST", "/echo", body=f"hello {i}", timeout=30)
    print(r.status, r.json()["got"], r.json()["attempt"], flush=True)
print("available", ep.available("model"), flush=True)
"""


def test_handle_values_parse_and_refuse_descriptors() -> None:
    t = current()
    assert t.scheme == "handle"
    assert t.parse("handle:1234") == 1234
    assert t.format(1234) == "handle:1234"
    for bad in ("fd:3", "handle:x", "1234"):
        with pytest.raises(UnsupportedHandle):
            t.parse(bad)


def test_pair_round_trip_timeout_and_end_of_file() -> None:
    a, b = current().pair()
    a.sendall(b"ping\n")
    assert b.recv(100) == b"ping\n"
    b.settimeout(0.05)
    with pytest.raises(TimeoutError):
        b.recv(100)
    f = b.makefile("rb")
    a.sendall(b"line one\nline two\n")
    assert f.readline() == b"line one\n"
    a.close()
    assert f.read() == b"line two\n"  # then end of file
    f.close()
    b.close()
    assert b.fileno() == -1


def test_a_handle_cannot_ride_along_a_message() -> None:
    a, b = current().pair()
    try:
        with pytest.raises(UnsupportedHandle, match="duplicates it into the receiver"):
            current().send(a, b"x\n", attach=b.fileno())
    finally:
        a.close()
        b.close()


def test_inherit_channel_is_a_handle_list(monkeypatch: pytest.MonkeyPatch) -> None:
    agent_end, service_end = current().pair(child=True)
    monkeypatch.setenv(ep.CHANNEL_ENV, current().format(service_end.fileno()))
    kwargs = ep.inherit_channel()
    assert set(kwargs) == {"startupinfo", "close_fds"}
    assert kwargs["startupinfo"].lpAttributeList["handle_list"] == [service_end.fileno()]
    # The daemon started with them holds the channel and says hello on it.
    code = "from oarbank_sdk import service_endpoint as ep; ep.Acceptor(features='')"
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, **kwargs)
    service_end.close()
    agent = Line(agent_end.detach())
    try:
        assert agent.read() == {"op": "hello", "pid": child.pid}
        assert child.wait(timeout=60) == 0
    finally:
        agent.close()


def test_a_job_in_a_child_reaches_the_service_over_duplicated_pipes() -> None:
    """The seed's whole path: connector inherited by handle list, connect with the job's pid,
    both ends duplicated, five HTTP round trips over keep-alive, ``serve_http`` on pipes."""
    t = current()
    agent_ch, service_ch = t.pair()
    acc = ep.Acceptor(channel=t.format(service_ch.detach()), features="")
    channel = Line(agent_ch.detach())
    assert channel.read() == {"op": "hello", "pid": os.getpid()}
    server = threading.Thread(target=ep.serve_http, args=(Echo, acc), daemon=True)
    server.start()

    agent_conn, job_conn = t.pair(child=True)
    env = {**os.environ, ep.env_name("model"): t.format(job_conn.fileno())}
    job = subprocess.Popen([sys.executable, "-c", JOB], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           **t.inheritable_kwargs(job_conn.fileno()))
    job_conn.close()
    broker = Broker(Line(agent_conn.detach()), channel, job.pid)
    broker.start()
    try:
        out, err = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines == [f"200 hello {i} 7" for i in range(5)] + ["available True"]
    broker.join(timeout=30)  # the connector's end of file: the job exited
    assert broker.conns == 1  # keep-alive: one connection carried all five
    assert all(m["pid"] == job.pid for m in broker.seen if m.get("op") == "connect")
    acc.close()
    server.join(timeout=30)
    assert not server.is_alive()
    channel.close()


def test_a_connect_from_a_pid_outside_the_attempt_is_refused_bad_pid() -> None:
    t = current()
    agent_conn, job_conn = t.pair(child=True)
    env = {**os.environ, ep.env_name("model"): t.format(job_conn.fileno())}
    code = ("from oarbank_sdk import service_endpoint as ep\n"
            "try:\n    ep.connect('model', timeout=30)\n"
            "except ep.EndpointError as e:\n    print(e.code, flush=True)\n")
    job = subprocess.Popen([sys.executable, "-c", code], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, **t.inheritable_kwargs(job_conn.fileno()))
    job_conn.close()
    a, b = t.pair()
    # The broker expects another pid: the child's connect names its own, so it is refused.
    broker = Broker(Line(agent_conn.detach()), Line(a.detach()), job_pid=job.pid + 4)
    broker.start()
    out, _ = job.communicate(timeout=120)
    assert out.decode().split() == ["bad_pid"]
    broker.join(timeout=30)
    b.close()
