"""The portal's server (Starlette on uvicorn) against misbehaving clients, over real sockets:
bodies cut short, stalled heads and bodies, too many connections. The issue's numbers: 200
stalled POSTs held 201 threads for 30 s and more, a body cut off at `{` was parsed as a
heartbeat, and BrokenPipe tracebacks made 4,807 log lines."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from portal_helpers import heartbeat, service_row


def connect(p: Any) -> socket.socket:
    host, port = p.url.removeprefix("http://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def head(p: Any, length: int, token: str, extra: str = "") -> bytes:
    host = p.url.removeprefix("http://")
    return (f"POST /v1/heartbeat HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: {length}\r\n{extra}\r\n").encode()


def read_all(s: socket.socket, timeout: float) -> bytes:
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def refused(p: Any, cause: str) -> float:
    for line in p.get("/metrics").text.splitlines():
        if line.startswith(f'oarbank_portal_reports_refused_total{{cause="{cause}"}}'):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(cause)


def test_a_body_cut_short_is_never_parsed(start_portal) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    token = p.token("node-a")
    body = json.dumps(heartbeat("node-a", service_row())).encode()
    for cut in (b"{", body[: len(body) // 2]):
        s = connect(p)
        s.sendall(head(p, len(body), token) + cut)
        s.close()  # the client goes away mid-body
    deadline = time.monotonic() + 10
    while refused(p, "truncated") < 2:
        assert time.monotonic() < deadline, p.log.read_text()
        time.sleep(0.05)
    assert p.services() == [] and p.get("/v1/nodes").json() == []
    log = p.log.read_text()
    assert "body cut short, not parsed" in log
    assert "Traceback" not in log and "BrokenPipe" not in log


def test_stalled_heads_and_bodies_are_timed_out_without_threads(start_portal) -> None:  # type: ignore[no-untyped-def]
    p = start_portal(args=("--read-timeout-s", "1.5"))
    token = p.token("node-a")
    proc = psutil.Process(p.proc.pid)
    threads_before = proc.num_threads()
    stalled = []
    for i in range(200):
        s = connect(p)
        if i % 2:
            s.sendall(head(p, 500, token) + b'{"node_id": ')  # half a body, then nothing
        else:
            s.sendall(b"POST /v1/heartbeat HTTP/1.1\r\nHost: ")  # half a head, then nothing
        stalled.append(s)
    try:
        time.sleep(0.5)
        threads = proc.num_threads()
        # a normal report goes through meanwhile
        t0 = time.monotonic()
        assert p.post_heartbeat(heartbeat("node-a", service_row())).status == 200
        answered_in = time.monotonic() - t0
        bodies = [read_all(s, 10) for s in stalled]
    finally:
        for s in stalled:
            s.close()
    print(f"\nthreads: {threads_before} before, {threads} with 200 stalled clients; a report "
          f"answered in {answered_in * 1000:.0f} ms meanwhile")
    # bounded by the thread pool (--pool-size, default 10), not by the number of clients
    assert threads < threads_before + 15
    assert answered_in < 5
    half_bodies = bodies[1::2]
    assert all(b.startswith(b"HTTP/1.1 408") for b in half_bodies), half_bodies[:3]
    assert b"not received within 1.5 s" in half_bodies[0]
    assert all(b == b"" for b in bodies[::2])  # half a head: closed without an answer
    assert refused(p, "read_timeout") == 100
    log = p.log.read_text()
    assert log.count("heartbeat refused (read_timeout)") == 1  # not 100 lines, not tracebacks
    assert "Traceback" not in log
    assert [r["node_id"] for r in p.services()] == ["node-a"]


def test_connections_beyond_the_limit_are_answered_503(start_portal) -> None:  # type: ignore[no-untyped-def]
    p = start_portal(args=("--max-connections", "10", "--read-timeout-s", "30"))
    idle = [connect(p) for _ in range(12)]
    try:
        time.sleep(0.3)
        r = p.get("/healthz")
        assert r.status == 503
    finally:
        for s in idle:
            s.close()
    deadline = time.monotonic() + 10
    while p.get("/healthz").status != 200:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_body_needs_a_declared_length(start_portal) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    s = connect(p)
    host = p.url.removeprefix("http://")
    s.sendall(f"POST /v1/heartbeat HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json"
              f"\r\nAuthorization: Bearer {p.token('n')}\r\nTransfer-Encoding: chunked\r\n\r\n"
              "1\r\n{\r\n0\r\n\r\n".encode())
    reply = read_all(s, 10)
    s.close()
    assert reply.startswith(b"HTTP/1.1 411") and b"Content-Length is required" in reply


@pytest.mark.skipif(not hasattr(os, "fork"), reason="--workers forks (POSIX)")
def test_several_workers_on_one_socket(start_portal, store_url) -> None:  # type: ignore[no-untyped-def]
    """--workers 2: two processes answer on one socket; /metrics, answered by either, sums
    both (prometheus_client's multiprocess files); SIGTERM stops them all, exit 0."""
    p = start_portal(db=store_url, args=("--workers", "2"))
    workers = psutil.Process(p.proc.pid).children()
    assert len(workers) == 2
    for i in range(20):  # new connections each: the kernel spreads them over the workers
        assert p.post_heartbeat(heartbeat(f"n{i}", service_row())).status == 200
    for _ in range(4):
        text = p.get("/metrics").text
        assert "oarbank_portal_reports_accepted_total 20.0" in text, text[:2000]
    assert len(p.services()) == 20
    p.proc.terminate()
    assert p.proc.wait(20) == 0
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    if not str(store_url).startswith("postgresql"):  # each worker closed its connections:
        assert not Path(f"{store_url}-wal").exists()  # the last one folded the WAL back
