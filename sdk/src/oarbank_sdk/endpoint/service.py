"""Service side of endpoints: say hello on the channel and take the connections jobs open.

The channel is an inherited, already-connected stream named by ``OARBANK_ENDPOINT_CHANNEL``
(``fd:<n>``), given to the ``start`` op only; ``start`` passes it on with ``inherit_channel()``.

    service -> agent  {"op": "hello", "pid": <pid>}                   once, first
    agent -> service  {"op": "connection", "conn": n, "attempt": id} + the service's end
                      (id: an integer from agents, ours and upstream's; a string from older
                      ones; handed to the service as it came)
    service -> agent  {"op": "accepted", "conn": n}
    service -> agent  {"op": "ready"}                                   at most once, after hello,
                      only where OARBANK_ENDPOINT_FEATURES offers it (``Acceptor.ready()``)
    agent -> service  {"op": "ended", "attempt": id}                   close that attempt's rest

End of file on the channel means the agent is stopping the service: ``accept`` raises
``ChannelClosed``, iteration stops, ``serve_http`` returns, and the service should exit.

Malformed agent messages (not JSON, over 4096 bytes, unknown op, wrong fields, a
``connection`` without a descriptor or with an unusable one) are logged as warnings on the
``oarbank_sdk.service_endpoint`` logger, counted in ``Acceptor.malformed``, and skipped: one
bad line must not take a serving process down. Descriptors riding on messages that should
carry none are closed, never used.

Standard library only.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import queue
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from oarbank_sdk._transport import UnsupportedHandle, current
from oarbank_sdk._wire import (
    Accepted,
    Connection,
    Ended,
    Hello,
    Ready,
    WireError,
    parse_line_to_service,
)
from oarbank_sdk.endpoint.errors import ChannelClosed, EndpointError
from oarbank_sdk.endpoint.stream import MessageStream

__all__ = [
    "CHANNEL_ENV",
    "FEATURES_ENV",
    "CONNECTIONS_PER_ATTEMPT",
    "MAX_PER_ATTEMPT",
    "Acceptor",
    "EndpointSocket",
    "inherit_channel",
    "serve_http",
]

CHANNEL_ENV = "OARBANK_ENDPOINT_CHANNEL"
# Features the agent offers (comma-separated): "ready" lets the service say it is ready on the
# channel instead of being polled with its `ready` op.
FEATURES_ENV = "OARBANK_ENDPOINT_FEATURES"
CONNECTIONS_PER_ATTEMPT = 64
MAX_PER_ATTEMPT = CONNECTIONS_PER_ATTEMPT  # upstream's name for the same cap

log = logging.getLogger("oarbank_sdk.service_endpoint")

_AF_UNIX = int(getattr(socket, "AF_UNIX", 1))
_SOCK_STREAM = int(socket.SOCK_STREAM)


def _channel_fd(channel: str | None) -> int:
    value = channel if channel is not None else os.environ.get(CHANNEL_ENV)
    if not value:
        raise EndpointError(
            "no_channel",
            f"{CHANNEL_ENV} is not set: only the agent's `start` op gets the endpoint channel "
            "(is the service declared with endpoint = true, and did `start` pass it on?)",
        )
    try:
        fd = current().parse(value)
        current().is_stream(fd)  # OSError: not open
    except (UnsupportedHandle, OSError) as exc:
        raise EndpointError("bad_endpoint", f"{CHANNEL_ENV}={value!r} is not usable: {exc}") from None
    return fd


def inherit_channel() -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments that pass the endpoint channel to the daemon
    ``start`` leaves running: ``pass_fds=(n,)`` and ``close_fds=True`` (Windows: a
    ``startupinfo`` whose ``handle_list`` holds the channel's handle, and ``close_fds=True``). The environment
    variable is inherited as is (if you pass ``env=``, keep ``OARBANK_ENDPOINT_CHANNEL`` in it).

    Raises ``EndpointError``: ``no_channel`` when the variable is unset, ``bad_endpoint`` when
    it names no open descriptor.
    """
    return current().inheritable_kwargs(_channel_fd(None))


class EndpointSocket(socket.socket):
    """A connection the agent handed over. ``close()`` also makes the acceptor forget it.
    ``attempt``: the id of the attempt it belongs to, as the agent sent it (a handler of
    ``serve_http`` reads it as ``self.connection.attempt``)."""

    _forget: Callable[[], None] | None = None
    attempt: int | str | None = None

    def close(self) -> None:
        forget, self._forget = self._forget, None
        if forget is not None:
            forget()
        super().close()


def _carries_fd(msg: Any) -> bool:
    return isinstance(msg, Connection)


class Acceptor:
    """The service's end of the endpoint channel.

    ``Acceptor(max_per_attempt=64, *, channel=None)`` opens ``channel`` (``"fd:<n>"``;
    default: the value of ``OARBANK_ENDPOINT_CHANNEL``, which is then removed from
    ``os.environ`` so the service's children do not inherit a name for a descriptor they do
    not hold) and says hello. Raises ``EndpointError``: ``no_channel`` if it is missing,
    ``bad_endpoint`` if it is unusable; ``ChannelClosed`` if the agent already closed it; ``ValueError`` for a
    ``max_per_attempt`` that is not a positive integer. The first parameter is upstream's, so
    ``Acceptor(32)`` means the same on both SDKs.

    ``accept()`` / iteration yield ``(connection, attempt_id)``, the id as the agent sent it
    (an ``int`` from agents that number attempts, a ``str`` from older ones). Open
    connections are tracked per attempt: at most ``max_per_attempt`` each, the oldest cut
    (shutdown and close) to admit a new one; ``ended`` cuts what is left of that attempt.
    Connections the handler closes, or drops, are forgotten.

    ``ready()`` tells the agent the service can serve now, where the agent offers that
    (``OARBANK_ENDPOINT_FEATURES``; ``features`` overrides the variable): call it once the
    model is loaded, and jobs start at once instead of at the agent's next ``ready`` poll.
    """

    def __init__(self, max_per_attempt: int = CONNECTIONS_PER_ATTEMPT, *,
                 channel: str | None = None, features: str | None = None) -> None:
        if (not isinstance(max_per_attempt, int) or isinstance(max_per_attempt, bool)
                or max_per_attempt < 1):
            raise ValueError(f"Acceptor: max_per_attempt must be a positive integer, "
                             f"got {max_per_attempt!r}")
        self.max_per_attempt = max_per_attempt
        transport = current()
        fd = _channel_fd(channel)
        try:
            sock = transport.open_stream(fd)
        except UnsupportedHandle as exc:
            raise EndpointError("bad_endpoint", f"endpoint channel fd:{fd}: {exc}") from None
        self._stream = MessageStream(sock, transport)
        offered = os.environ.get(FEATURES_ENV, "") if features is None else features
        self.features = frozenset(f.strip() for f in offered.split(",") if f.strip())
        self._said_ready = False
        # Sends come from the accepting thread (`accepted`) and from whoever calls ready().
        self._send_lock = threading.Lock()
        self._accept_lock = threading.Lock()
        self._track_lock = threading.RLock()  # RLock: weakref callbacks may run under it
        self._open: dict[int | str, dict[int, weakref.ref[EndpointSocket]]] = {}
        self._keys = itertools.count()
        self.malformed = 0
        self.pid = os.getpid()
        # hello first and exactly once: the agent hands connections only after it.
        try:
            self._stream.send(Hello(self.pid))
        except BaseException:
            self._stream.close()
            raise
        if channel is None:
            # We hold the channel now; a child that read the name would find another
            # descriptor (or none) under that number.
            os.environ.pop(CHANNEL_ENV, None)

    # --- accepting ----------------------------------------------------------------------------

    def accept(self, timeout: float | None = None) -> tuple[EndpointSocket, int | str]:
        """Block until the agent hands over the next connection; return it with its attempt id.

        Handles ``ended`` messages while waiting. The caller owns the connection and should
        close it when done. Raises ``ChannelClosed`` at end of file: the agent is stopping
        the service, which should exit. ``timeout`` (ours; seconds, None: wait): raise
        ``TimeoutError`` when no connection came in time; ``0`` takes only what has already
        arrived, without waiting (an event loop calls it when ``fileno()`` is readable).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._accept_lock:
            while True:
                msg, fd = self._stream.next(parse_line_to_service, _carries_fd, deadline)
                if isinstance(msg, WireError):
                    self._malformed(f"ignoring a malformed message from the agent: {msg.detail}")
                elif isinstance(msg, Ended):
                    self._end_attempt(msg.attempt)
                elif fd is None:
                    self._malformed(f"ignoring connection {msg.conn}: it carried no descriptor")
                else:
                    conn = self._take(msg, fd)
                    if conn is not None:
                        return conn, msg.attempt

    def ready(self) -> bool:
        """Say ``{"op": "ready"}`` on the channel: the service can serve now. Sent at most
        once, and only where the agent offers the ``ready`` feature (an SDK sends nothing the
        agent did not offer; that agent polls the service's ``ready`` op instead, so the op
        must still answer true). Returns whether it was sent now. Thread-safe. Raises
        ``ChannelClosed`` if the agent has closed the channel.
        """
        if "ready" not in self.features:
            return False
        with self._send_lock:
            if self._said_ready:
                return False
            self._said_ready = True
            self._stream.send(Ready())
        return True

    def _send(self, msg: Accepted) -> None:
        with self._send_lock:
            self._stream.send(msg)

    def __iter__(self) -> Iterator[tuple[EndpointSocket, int | str]]:
        """Yield ``accept()`` results until the channel reaches end of file."""
        while True:
            try:
                yield self.accept()
            except ChannelClosed:
                return

    def _take(self, msg: Connection, fd: int) -> EndpointSocket | None:
        # We hold the descriptor: the receipt lets the agent drop its copy, even if the
        # descriptor turns out unusable.
        try:
            self._send(Accepted(msg.conn))
        except ChannelClosed:
            current().close_handle(fd)
            raise
        try:
            plain = current().open_stream(fd)
        except UnsupportedHandle as exc:
            current().close_handle(fd)
            self._malformed(f"ignoring connection {msg.conn}: {exc}")
            return None
        if isinstance(plain, socket.socket):
            # open_stream checked it is a unix stream: said as plain ints, not read back
            # through socket's enum properties (two enum lookups a connection).
            conn = EndpointSocket(_AF_UNIX, _SOCK_STREAM, 0, fileno=plain.detach())
        else:  # a Windows pipe stream: forgets itself on close too (its own attributes)
            conn = plain
        conn.attempt = msg.attempt
        self._track(conn, msg.attempt)
        return conn

    def _malformed(self, text: str) -> None:
        self.malformed += 1
        log.warning("endpoint channel: %s", text)

    # --- tracking -----------------------------------------------------------------------------

    def _track(self, conn: EndpointSocket, attempt: int | str) -> None:
        with self._track_lock:
            conns = self._open.setdefault(attempt, {})
            cut = []
            while len(conns) >= self.max_per_attempt:
                # The cap: the oldest open connection of this attempt makes room.
                cut.append(conns.pop(next(iter(conns))))
            key = next(self._keys)
            # One callable for both ways a connection goes (closed, or dropped: the weakref
            # passes itself, which _forget ignores).
            forget = functools.partial(self._forget, attempt, key)
            conns[key] = weakref.ref(conn, forget)
            conn._forget = forget
        for ref in cut:
            _cut(ref)

    def _forget(self, attempt: int | str, key: int, _ref: object = None) -> None:
        with self._track_lock:
            conns = self._open.get(attempt)
            if conns is not None:
                conns.pop(key, None)
                if not conns:
                    del self._open[attempt]

    def _end_attempt(self, attempt: int | str) -> None:
        # The attempt is over and its processes are gone: what is left of it is dead weight.
        with self._track_lock:
            conns = self._open.pop(attempt, {})
        for ref in conns.values():
            _cut(ref)

    def open_connections(self, attempt: int | str | None = None) -> int:
        """How many tracked connections are open (of one attempt, or of all)."""
        with self._track_lock:
            if attempt is not None:
                return len(self._open.get(attempt, ()))
            return sum(len(c) for c in self._open.values())

    # --- closing ------------------------------------------------------------------------------

    def fileno(self) -> int:
        return self._stream.fileno()

    # --- what serve_http's handlers see as self.server -----------------------------------------

    server_name = "endpoint"
    server_port = 0

    @property
    def acceptor(self) -> Acceptor:
        """This acceptor: handlers written for our SDK's earlier server object read
        ``self.server.acceptor``; upstream's read ``self.server`` (also this acceptor)."""
        return self

    def close(self) -> None:
        """Close the channel and cut every tracked connection. The agent treats a service that
        closes its channel as failed (it ends the process group), so call this only on the
        way out."""
        with self._track_lock:
            attempts, self._open = self._open, {}
        for conns in attempts.values():
            for ref in conns.values():
                _cut(ref)
        try:
            self._stream.sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept()
        except OSError:
            pass
        self._stream.close()

    def __enter__(self) -> Acceptor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut(ref: weakref.ref[EndpointSocket]) -> None:
    conn = ref()
    if conn is None:
        return
    conn._forget = None
    try:
        conn.shutdown(socket.SHUT_RDWR)  # wakes a handler blocked reading it
    except OSError:
        pass
    conn.close()


def _client_address(attempt: int | str) -> tuple[str, int]:
    """What a ``serve_http`` handler sees as ``client_address`` for a connection of
    ``attempt``: ``("attempt-<id>", 0)``, upstream's form (so its log lines name the attempt).
    The id itself, typed as it came, is ``self.connection.attempt``."""
    return (f"attempt-{attempt}", 0)


def _handle(handler: type[BaseHTTPRequestHandler], conn: EndpointSocket, attempt: int | str,
            server: Acceptor) -> None:
    try:
        handler(conn, _client_address(attempt), server)  # type: ignore[arg-type]
    except Exception:
        log.exception("endpoint handler failed on a connection of attempt %s", attempt)
    finally:
        try:
            conn.shutdown(socket.SHUT_WR)  # as socketserver does: the client sees the end
        except OSError:
            pass
        conn.close()


class _Workers:
    """Daemon threads that run one connection's handler each, reused: a connection goes to an
    idle worker, else a new one starts (so connections never wait for each other, as with a
    thread each). Starting a thread costs more than handing it work, and a job's pooled
    ``request()`` makes a connection per worker, not per request. At most ``keep`` workers
    wait idle, each for at most ``idle_s``."""

    def __init__(self, name: str, keep: int = 8, idle_s: float = 60.0) -> None:
        self._name = name
        self._keep = keep
        self._idle_s = idle_s
        self._lock = threading.Lock()
        self._idle = 0  # workers waiting on the queue (each item taken by exactly one)
        self._work: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = \
            queue.SimpleQueue()
        self._count = itertools.count(1)

    def run(self, fn: Callable[..., None], *args: Any) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1  # that worker is taken: the item is its
                self._work.put((fn, args))
                return
        threading.Thread(target=self._loop, args=(fn, args), daemon=True,
                         name=f"{self._name}-{next(self._count)}").start()

    def _loop(self, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
        while True:
            fn(*args)
            with self._lock:
                if self._idle >= self._keep:
                    return
                self._idle += 1
            try:
                fn, args = self._work.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    try:
                        # run() counted us taken just as we timed out: the item is ours.
                        fn, args = self._work.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        return


def serve_http(handler: type[BaseHTTPRequestHandler], acceptor: Acceptor | None = None) -> None:
    """Run ``handler`` (a ``BaseHTTPRequestHandler`` subclass) on every connection the
    agent hands over, a daemon thread each (reused from a small pool of idle ones); return
    when the agent closes the channel.

    Set ``protocol_version = "HTTP/1.1"`` on the handler for keep-alive. Handlers see, as on
    upstream's SDK, ``client_address == ("attempt-<id>", 0)`` and the acceptor as
    ``self.server`` (ours: ``self.server.acceptor`` is the same object, and
    ``self.connection.attempt`` the attempt id as it came). Creates an
    ``Acceptor()`` (which says hello) when none is given; raises ``EndpointError``
    (``no_channel``) if that fails. After it returns the service should exit.
    """
    acc = acceptor if acceptor is not None else Acceptor()
    workers = _Workers("endpoint")
    for conn, attempt in acc:
        workers.run(_handle, handler, conn, attempt, acc)
