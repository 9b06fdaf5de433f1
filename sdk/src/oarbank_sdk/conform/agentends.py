"""The agent's ends of a module's endpoint channel and of an attempt's connector, for the
conformance kit (and for tests that play the agent); ``host`` re-exports them.

- ``Channel``: the agent end of an endpoint channel: waits for the hello, hands connections
  (``connection`` + descriptor, kept until ``accepted``), sends ``ended``;
- ``Connector``: the agent end of one attempt's connector: answers each ``connect`` with a new
  socketpair, one end to the service over the channel, the other to the job (kept until
  ``received``); ``bad_request`` for anything else, ``service_unavailable`` when the channel
  is not up.

On Windows the ends are duplex pipes (``oarbank_sdk._winpipe``) and nothing rides along a
message: each end handed over is duplicated into the receiving process (the service's daemon,
named by its hello; the job process named by its connect, once that pid is known to be in the
attempt's job object, else ``bad_pid``) and named in the message (``"handle": h``), as the
Windows agent does (``oarbank_sdk._winpipe.duplicate_into``).

Each Channel and Connector has one reader thread; sends are serialised by a lock.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from typing import Any

from oarbank_sdk import _transport, _winpipe, advice
from oarbank_sdk._wire import (
    Accepted,
    Connect,
    Hello,
    LineSplitter,
    Ok,
    Ready,
    Received,
    Refusal,
    WireError,
    decode,
    encode,
    parse_from_job,
    parse_from_service,
)

__all__ = ["Channel", "Connector", "wire_attempt"]

WINDOWS = sys.platform == "win32"


def _sendall(t: _transport.Transport, sock: socket.socket, data: bytes, attach: int | None) -> None:
    """Send a whole message; the descriptor rides with its first byte."""
    sent = t.send(sock, data, attach=attach)
    while sent < len(data):
        sent += t.send(sock, data[sent:])


class _Reader:
    """A thread reading line messages from one socket; descriptors a peer attaches to its own
    messages are closed, never used (contract section 3)."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock = sock
        self.t = _transport.current()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        splitter = LineSplitter()
        while True:
            try:
                data, fds = self.t.recv(self.sock, 65536)
            except OSError as exc:
                self.on_eof(f"read failed: {exc}")
                return
            for fd in fds:
                os.close(fd)
            if not data:
                self.on_eof("end of file")
                return
            try:
                lines = splitter.feed(data)
            except WireError as exc:
                self.on_bad_line(exc)
                continue
            for line in lines:
                try:
                    self.on_message(decode(line))
                except WireError as exc:
                    self.on_bad_line(exc)

    def on_message(self, msg: dict) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def on_bad_line(self, exc: WireError) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def on_eof(self, why: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class _AgentEnd(_Reader):
    """The agent's end of a socketpair whose other end (``child_fd``) a child inherits.

    Ends handed to the peer are kept in ``_pending`` (conn -> our copy) until its receipt;
    ``close`` closes them with the socket."""

    def __init__(self, name: str) -> None:
        agent_end, child_end = _transport.current().pair()
        super().__init__(agent_end, name)
        self.child_fd: int | None = child_end.detach()
        self._lock = threading.Lock()
        self._pending: dict[int, socket.socket] = {}  # conn -> our copy, until the receipt
        self._next_conn = 1
        self._closing = False

    @property
    def env_value(self) -> str:
        assert self.child_fd is not None
        return self.t.format(self.child_fd)

    def close_child_end(self) -> None:
        """After the child was spawned: only the child holds its end now."""
        if self.child_fd is not None:
            self.t.close_handle(self.child_fd)
            self.child_fd = None

    def close(self) -> None:
        """The agent closes its end: the peer sees end of file."""
        self._closing = True
        self.close_child_end()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.join()
        self.sock.close()
        with self._lock:
            for copy in self._pending.values():
                copy.close()
            self._pending.clear()


class Channel(_AgentEnd):
    """The agent's end of one endpoint channel. ``child_fd`` goes to ``start``; ``close`` is
    stop order step 2 (the service sees end of file)."""

    def __init__(self) -> None:
        super().__init__("conform-channel")
        self._hello = threading.Event()
        self.hello_pid: int | None = None
        # {"op": "ready"} (the `ready` feature the kit offers, as an agent does); also set at
        # the service's EOF, to wake a waiter: check ``said_ready``.
        self.ready_event = threading.Event()
        self.said_ready = False
        self.closed_reason: str | None = None  # set when the SERVICE closed or broke it
        self.problems: list[str] = []  # protocol violations by the service
        self.handed = 0
        self.start()

    @property
    def is_open(self) -> bool:
        return self.closed_reason is None and not self._closing

    def wait_hello(self, timeout_s: float) -> int | None:
        self._hello.wait(max(0.0, timeout_s))
        return self.hello_pid

    def on_message(self, msg: dict) -> None:
        try:
            parsed = parse_from_service(msg)
        except WireError as exc:
            self.on_bad_line(exc)
            return
        if isinstance(parsed, Hello):
            if self.hello_pid is not None:
                self.problems.append(f"a second hello (pid {parsed.pid}); hello comes exactly once")
                return
            self.hello_pid = parsed.pid  # state: channel up, connections may be handed
            self._hello.set()
        elif isinstance(parsed, Ready):
            if self.hello_pid is None:
                self.problems.append("'ready' before hello; hello must come first")
            elif self.said_ready:
                self.problems.append("a second 'ready'; it is said at most once")
            else:
                self.said_ready = True  # state: the service says it can serve
                self.ready_event.set()
        elif isinstance(parsed, Accepted):
            if self.hello_pid is None:
                self.problems.append("'accepted' before hello; hello must come first")
            with self._lock:
                copy = self._pending.pop(parsed.conn, None)
            if copy is None:
                self.problems.append(f"'accepted' for conn {parsed.conn}, which was never handed")
            else:
                copy.close()  # receipt: the service holds its end, ours can go

    def on_bad_line(self, exc: WireError) -> None:
        self.problems.append(f"malformed message on the channel: {exc.detail}")

    def on_eof(self, why: str) -> None:
        if not self._closing:
            # state: the service closed its channel (a service failure per the contract)
            self.closed_reason = advice.channel_closed(why)
        self._hello.set()  # wake a waiter: no hello will come now
        self.ready_event.set()  # nor a `ready`

    def hand(self, attempt: str, service_end: socket.socket) -> int:
        """Send ``service_end`` to the service as a connection of ``attempt`` (named here;
        the service sees its integer wire id, as from an agent). Takes ownership of
        ``service_end`` (kept until the service's receipt)."""
        with self._lock:
            conn = self._next_conn
            self._next_conn += 1
            msg: dict[str, Any] = {"op": "connection", "conn": conn,
                                   "attempt": wire_attempt(attempt)}
            if not WINDOWS:
                _sendall(self.t, self.sock, encode(msg), service_end.fileno())
            else:  # the service's copy first, then the message that names it
                assert self.hello_pid is not None
                try:
                    msg["handle"] = _winpipe.duplicate_into(self.hello_pid, service_end.fileno())
                except OSError:
                    service_end.close()
                    raise
                try:
                    _sendall(self.t, self.sock, encode(msg), None)
                except OSError:
                    _winpipe.close_in(self.hello_pid, msg["handle"])
                    service_end.close()
                    raise
            self._pending[conn] = service_end
            self.handed += 1
        return conn

    def ended(self, attempt: str) -> None:
        with self._lock:
            _sendall(self.t, self.sock, encode({"op": "ended", "attempt": wire_attempt(attempt)}),
                     None)

    def pending_receipts(self) -> int:
        with self._lock:
            return len(self._pending)


# Attempt names -> the integers services see on the channel (contract section 3: agents send
# integers, and a service built on upstream's SDK does int(msg["attempt"])). One counter per
# process, never reused, like an agent's.
_wire_lock = threading.Lock()
_wire_ids: dict[str, int] = {}


def wire_attempt(attempt: str) -> int:
    """The integer id of the attempt named ``attempt`` on every channel of this process."""
    with _wire_lock:
        return _wire_ids.setdefault(attempt, len(_wire_ids) + 1)


class Connector(_AgentEnd):
    """The agent's end of one attempt's connector to one service's channel. Job ends handed
    over wait in ``_pending`` until the job's ``received``."""

    def __init__(self, attempt: str, channel: Channel) -> None:
        super().__init__(f"conform-connector-{attempt}")
        self.attempt = attempt
        self.channel = channel
        self.connects = 0
        self.refusals: list[str] = []
        self.problems: list[str] = []
        self.job: Any = None  # Windows: the attempt's job object (``run_runner`` sets it)
        self.start()

    def _reply(self, msg: dict, attach: int | None = None) -> None:
        with contextlib.suppress(OSError):
            _sendall(self.t, self.sock, encode(msg), attach)

    def _refuse(self, code: str, detail: str) -> None:
        self.refusals.append(f"{code}: {detail}")
        self._reply(Refusal(code, detail).to_wire())

    def on_message(self, msg: dict) -> None:
        try:
            parsed = parse_from_job(msg)
        except WireError as exc:
            self.on_bad_line(exc)
            return
        if isinstance(parsed, Received):
            with self._lock:
                copy = self._pending.pop(parsed.conn, None)
            if copy is None:
                self.problems.append(f"'received' for conn {parsed.conn}, which was never sent")
            else:
                copy.close()
            return
        assert isinstance(parsed, Connect)
        if WINDOWS and not (self.job is not None and self.job.contains(parsed.pid)):
            self._refuse("bad_pid", f"pid {parsed.pid} is not a process of this attempt")
            return
        if not (self.channel.is_open and self.channel.hello_pid is not None):
            why = self.channel.closed_reason or "the service has not said hello"
            self._refuse("service_unavailable", f"the service is not ready: {why}")
            return
        job_end, service_end = self.t.pair()
        try:
            self.channel.hand(self.attempt, service_end)
        except OSError as exc:
            job_end.close()
            self._refuse("service_unavailable", f"handing the connection failed: {exc}")
            return
        handle = None
        if WINDOWS:
            try:
                handle = _winpipe.duplicate_into(parsed.pid, job_end.fileno())
            except OSError as exc:
                job_end.close()
                self._refuse("bad_pid", f"pid {parsed.pid} cannot be given the connection: {exc}")
                return
        with self._lock:
            conn = self._next_conn
            self._next_conn += 1
            self._pending[conn] = job_end
            self.connects += 1
        if handle is None:
            self._reply(Ok(conn).to_wire(), attach=job_end.fileno())
        else:
            self._reply(Ok(conn, handle).to_wire())

    def on_bad_line(self, exc: WireError) -> None:
        self.problems.append(exc.detail)
        self._refuse("bad_request", exc.detail)

    def on_eof(self, why: str) -> None:
        pass  # the job closed its connector (or exited): nothing more to answer
