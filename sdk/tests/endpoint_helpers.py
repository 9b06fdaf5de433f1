"""Helpers for the service_endpoint tests.

``FakeAgent`` is THE TEST'S STAND-IN FOR THE AGENT: the real broker (oarbank_agent.broker.handover) is
written in parallel, and integration tests against it live in agent/tests. The stand-in plays
the agent's role of contract section 3 over real ``socketpair(AF_UNIX, SOCK_STREAM)`` pairs
and real SCM_RIGHTS descriptors, with threads. It is deliberately written without the SDK's
own stream code, so the SDK is not tested against itself.

Run as a program it is the service side used in subprocess tests:

    python endpoint_helpers.py start   # the `start` op: leaves `serve` running with the channel
    python endpoint_helpers.py serve   # Acceptor + serve_http(EchoHandler)
"""

from __future__ import annotations

import array
import itertools
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

# --- raw line peer ---------------------------------------------------------------------------


class RawPeer:
    """One end of a connector or channel, spoken by hand (agent side of a test)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()

    def send(self, data: bytes | dict, attach: int | None = None) -> None:
        if isinstance(data, dict):
            data = json.dumps(data).encode() + b"\n"
        if attach is None:
            self.sock.sendall(data)
        else:
            fds = array.array("i", [attach])
            sent = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            if sent < len(data):
                self.sock.sendall(data[sent:])

    def read(self, timeout: float = 5.0) -> dict | None:
        """The next JSON line, or None at end of file."""
        self.sock.settimeout(timeout)
        while b"\n" not in self._buf:
            data = self.sock.recv(65536)
            if not data:
                return None
            self._buf += data
        line, _, rest = bytes(self._buf).partition(b"\n")
        self._buf = bytearray(rest)
        return json.loads(line)

    def close(self) -> None:
        self.sock.close()


# --- the agent stand-in -------------------------------------------------------------------------


class FakeAgent:
    """Test stand-in for the agent's broker (see the module docstring).

    - ``channel_child``: the service's end of the endpoint channel (pass it on, then call
      ``close_child_end``), or ``None`` with ``channel=False``: then the service ends of
      connections queue up in ``service_ends`` for the test to use directly.
    - ``open_connector(attempt)``: a connector; returns the job's end (a socket the caller
      owns). A thread answers ``connect`` with a fresh socketpair, or with the next entry of
      ``refusals``.
    """

    def __init__(self, channel: bool = True) -> None:
        self.cond = threading.Condition()
        self.hello_pids: list[int] = []
        self.ready_lines = 0  # {"op": "ready"} lines the service sent on the channel
        self.accepted: list[int] = []
        self.received: list[int] = []
        self.connect_pids: list[int] = []
        self.connections: list[tuple[int, str]] = []  # (conn, attempt) as sent to the service
        self.bad_lines: list[bytes] = []
        self.refusals: deque[tuple[str, str]] = deque()
        self.service_ends: deque[tuple[socket.socket, str]] = deque()
        self._ids = itertools.count(1)
        self._held: dict[tuple[str, int], socket.socket] = {}  # ends awaiting receipts
        self._socks: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._send_lock = threading.Lock()
        self.channel: socket.socket | None = None
        self.channel_child: socket.socket | None = None
        if channel:
            self.channel, self.channel_child = socket.socketpair()
            self._socks.append(self.channel)
            self._spawn(self._read_channel)

    # -- set-up --

    def close_child_end(self) -> None:
        if self.channel_child is not None:
            self.channel_child.close()
            self.channel_child = None

    def open_connector(self, attempt: str) -> socket.socket:
        agent_end, job_end = socket.socketpair()
        self._socks.append(agent_end)
        self._spawn(self._serve_connector, agent_end, attempt)
        return job_end

    # -- agent actions --

    def send_channel(self, data: bytes | dict, attach: int | None = None) -> None:
        assert self.channel is not None
        with self._send_lock:
            RawPeer(self.channel).send(data, attach)

    def send_ended(self, attempt: str) -> None:
        self.send_channel({"op": "ended", "attempt": attempt})

    def close_channel(self) -> None:
        """The agent closes the channel: the service sees end of file."""
        if self.channel is not None:
            self.channel.shutdown(socket.SHUT_RDWR)

    def wait(self, predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(predicate, timeout)

    def close(self) -> None:
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in self._threads:
            t.join(5)
        for s in self._socks:
            s.close()
        self.close_child_end()
        with self.cond:
            held, self._held = self._held, {}
        for s in held.values():
            s.close()
        while self.service_ends:
            self.service_ends.popleft()[0].close()

    # -- internals --

    def _spawn(self, target: Callable, *args: object) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(t)
        t.start()

    def _serve_connector(self, sock: socket.socket, attempt: str) -> None:
        peer = RawPeer(sock)
        while True:
            try:
                msg = peer.read(timeout=None)  # type: ignore[arg-type]
            except (OSError, ValueError):
                return
            if msg is None:
                return
            if msg.get("op") == "received":
                with self.cond:
                    self.received.append(msg["conn"])
                    held = self._held.pop(("job", msg["conn"]), None)
                    self.cond.notify_all()
                if held is not None:
                    held.close()
                continue
            if msg.get("op") != "connect":
                with self.cond:
                    self.bad_lines.append(json.dumps(msg).encode())
                peer.send({"ok": False, "error": "bad_request", "detail": "unknown op"})
                continue
            with self.cond:
                self.connect_pids.append(msg["pid"])
                refusal = self.refusals.popleft() if self.refusals else None
            if refusal is not None:
                peer.send({"ok": False, "error": refusal[0], "detail": refusal[1]})
                continue
            job_end, service_end = socket.socketpair()
            conn = next(self._ids)
            with self.cond:
                # Receipts: the agent keeps its copy of each end until received/accepted.
                self._held[("job", conn)] = job_end
            if self.channel is not None:
                with self.cond:
                    self._held[("service", conn)] = service_end
                    self.connections.append((conn, attempt))
                self.send_channel(
                    {"op": "connection", "conn": conn, "attempt": attempt}, service_end.fileno()
                )
            else:
                with self.cond:
                    self.service_ends.append((service_end, attempt))
                    self.cond.notify_all()
            try:
                peer.send({"ok": True, "conn": conn}, job_end.fileno())
            except OSError:
                return

    def _read_channel(self) -> None:
        assert self.channel is not None
        peer = RawPeer(self.channel)
        while True:
            try:
                msg = peer.read(timeout=None)  # type: ignore[arg-type]
            except (OSError, ValueError):
                return
            if msg is None:
                return
            held = None
            with self.cond:
                if msg.get("op") == "hello":
                    self.hello_pids.append(msg["pid"])
                elif msg == {"op": "ready"}:
                    self.ready_lines += 1
                elif msg.get("op") == "accepted":
                    self.accepted.append(msg["conn"])
                    held = self._held.pop(("service", msg["conn"]), None)
                else:
                    self.bad_lines.append(json.dumps(msg).encode())
                self.cond.notify_all()
            if held is not None:
                held.close()


def poll(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    """Wait for a condition nobody signals (state of the code under test)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


# --- descriptor accounting ----------------------------------------------------------------------


def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")} - {-1}


def fds_settle(baseline: set[int], timeout: float = 5.0) -> set[int]:
    """Wait for daemon threads to finish closing; return descriptors opened since baseline."""
    deadline = time.monotonic() + timeout
    while True:
        extra = open_fds() - baseline
        if not extra or time.monotonic() > deadline:
            return extra
        time.sleep(0.02)


# --- the service program ------------------------------------------------------------------------


class EchoHandler(BaseHTTPRequestHandler):
    """Echoes requests. Paths for the pooled ``request()`` tests: ``/seen`` (how many requests
    came per path, and how many connections), ``/drop-reused`` (on a connection that already
    carried a request: read it, then close without a byte of answer), ``/partial-reused``
    (same, but close after half a status line), ``/gather`` (answer once ``GATHER`` requests
    wait at once). ``timeout`` (class attribute, seconds): idle connections are closed."""

    protocol_version = "HTTP/1.1"
    GATHER = 12
    _gate: threading.Barrier | None = None
    _seen: dict[str, int] = {}
    _seen_lock = threading.Lock()
    _requests_here = 0  # per instance: one handler instance serves one connection

    def _special(self) -> bool:
        """Count this request; True when it was answered (or dropped) here."""
        before, self._requests_here = self._requests_here, self._requests_here + 1
        with EchoHandler._seen_lock:
            EchoHandler._seen[self.path] = EchoHandler._seen.get(self.path, 0) + 1
            if before == 0:
                EchoHandler._seen["connections"] = EchoHandler._seen.get("connections", 0) + 1
            seen = dict(EchoHandler._seen)
            if EchoHandler._gate is None:
                EchoHandler._gate = threading.Barrier(EchoHandler.GATHER)
        if self.path == "/seen":
            self._reply(200, seen)
        elif self.path in ("/drop-reused", "/partial-reused") and before > 0:
            if self.path == "/partial-reused":
                self.wfile.write(b"HTTP/1.1 2")
                self.wfile.flush()
            self.close_connection = True
        elif self.path == "/gather":
            EchoHandler._gate.wait(60)
            self._reply(200, {"gathered": EchoHandler.GATHER})
        else:
            return False
        return True

    def _reply(self, status: int, payload: dict, close: bool = False) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        if self._special():
            return
        self._reply(200, {"pid": os.getpid(), "client": list(self.client_address),
                          "attempt": self.connection.attempt,
                          "path": self.path, "host": self.headers.get("Host")})

    def do_POST(self) -> None:  # noqa: N802
        n = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(n)
        if self._special():
            return
        self._reply(201, {"pid": os.getpid(), "client": list(self.client_address),
                          "content_type": self.headers.get("Content-Type"),
                          "body": raw.decode("utf-8")})

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass


def _main(argv: list[str]) -> int:
    from oarbank_sdk import service_endpoint as ep

    if argv[1] == "start":
        # As a module's `start` op does: leave the daemon running with the channel.
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve"],
                                **ep.inherit_channel())
        print(json.dumps({"ok": True, "daemon_pid": proc.pid}), flush=True)
        return 0
    if argv[1] == "serve":
        # ENDPOINT_HELPER_IDLE_S: close connections idle that long (as servers do).
        idle = os.environ.get("ENDPOINT_HELPER_IDLE_S")
        EchoHandler.timeout = float(idle) if idle else None
        acc = ep.Acceptor()
        ep.serve_http(EchoHandler, acc)
        print(json.dumps({"served": "eof", "malformed": acc.malformed}), flush=True)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
