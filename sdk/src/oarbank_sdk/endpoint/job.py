"""Job side of endpoints: open connections to a service through the attempt's connector.

The connector is an inherited, already-connected stream named by ``OARBANK_SERVICE_<NAME>``
(``fd:<n>``). Each ``connect`` is one exchange on it:

    job -> agent   {"op": "connect", "pid": <pid>}
    agent -> job   {"ok": true, "conn": n} + the job's end   |  {"ok": false, "error", "detail"}
    job -> agent   {"op": "received", "conn": n}

One connector object per service per process, opened on first use and kept open (the agent
closes it when the attempt ends). A lock serialises the exchange, so any number of threads
may connect at once. After ``fork`` the child gets fresh locks (a lock held by a parent thread
at fork time would otherwise never be released). Processes sharing one connector (fork
children, children given it with ``inherit_connector``) share one stream: they must not
``connect`` at the same moment as each other, or one may read the other's reply.

Standard library only.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from email.message import Message
from typing import Any, cast

from oarbank_sdk._transport import UnsupportedHandle, current
from oarbank_sdk._wire import Connect, Ok, Received, Refusal, WireError, parse_line_reply_to_job
from oarbank_sdk.endpoint import pool as pools
from oarbank_sdk.endpoint.errors import ChannelClosed, EndpointError
from oarbank_sdk.endpoint.stream import MessageStream
from oarbank_sdk.environments import service_env_name as env_name

__all__ = [
    "PREFIX",
    "available",
    "connect",
    "request",
    "Response",
    "Headers",
    "HTTPConnection",
    "inherit_connector",
    "env_name",
    "REQUEST_TIMEOUT_S",
]

# The upstream SDK's default for request(): a model call may take minutes, and a module
# moving between the two SDKs must not start timing out where it did not before.
REQUEST_TIMEOUT_S = 600.0
# What env_name() puts before the upper-cased service name (upstream's name for it).
PREFIX = "OARBANK_SERVICE_"


def _carries_fd(msg: Any) -> bool:
    return isinstance(msg, Ok)


class _Connector:
    """The process's end of one service's connector."""

    def __init__(self, service: str, stream: MessageStream) -> None:
        self.service = service
        self.stream = stream
        self.lock = threading.Lock()
        # Replies still owed to exchanges that timed out after sending `connect`: they are
        # read (and their connections received and closed) before the next exchange, so the
        # stream stays in step.
        self.owed = 0

    def for_child(self) -> _Connector:
        """The same stream for a freshly forked child: new lock, no buffered parent state."""
        # Descriptors the parent had queued are the child's copies now: nobody will claim them.
        self.stream.discard_queued()
        return _Connector(self.service, MessageStream(self.stream.sock, current()))

    def connect(self, timeout: float | None) -> socket.socket:
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self.lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            raise EndpointError("timeout", f"connect to {self.service!r}: connector busy for {timeout}s")
        try:
            while self.owed:
                try:
                    late = self._reply(deadline)
                except EndpointError as exc:
                    if exc.code in ("timeout", "closed"):
                        raise
                    late = None  # a late refusal or bad reply: nobody waits for it any more
                self.owed -= 1
                if late is not None:
                    late.close()
            self.stream.send(Connect(os.getpid()))
            self.owed += 1
            try:
                sock = self._reply(deadline)
            except EndpointError as exc:
                if exc.code != "timeout":  # this reply has been consumed
                    self.owed -= 1
                raise
            self.owed -= 1
            return sock
        finally:
            self.lock.release()

    def _reply(self, deadline: float | None) -> socket.socket:
        """Read one reply to a ``connect``; return the connection or raise ``EndpointError``."""
        try:
            msg, fd = self.stream.next(parse_line_reply_to_job, _carries_fd, deadline)
        except TimeoutError:
            raise EndpointError(
                "timeout", f"connect to {self.service!r}: no reply from the agent in time"
            ) from None
        if isinstance(msg, WireError):
            raise EndpointError(
                "bad_message", f"the agent's reply on {env_name(self.service)}: {msg.detail}"
            )
        if isinstance(msg, Refusal):
            raise EndpointError(msg.error, msg.detail)
        assert isinstance(msg, Ok)
        if fd is None:
            raise EndpointError(
                "bad_message", f"the agent's ok reply (conn {msg.conn}) carried no descriptor"
            )
        # We hold our end now: the receipt lets the agent drop its copy.
        try:
            self.stream.send(Received(msg.conn))
        except ChannelClosed:
            current().close_handle(fd)
            raise
        try:
            return current().open_stream(fd)
        except UnsupportedHandle as exc:
            current().close_handle(fd)
            raise EndpointError("bad_message", f"the agent sent an unusable descriptor: {exc}")


_lock = threading.Lock()
_connectors: dict[tuple[str, str], _Connector] = {}


def _after_fork_in_child() -> None:
    global _lock, _connectors
    _lock = threading.Lock()
    _connectors = {key: c.for_child() for key, c in _connectors.items()}


if hasattr(os, "register_at_fork"):  # not on Windows, where nothing forks
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _connector(service: str) -> _Connector:
    name = env_name(service)
    value = os.environ.get(name)
    if not value:
        raise EndpointError(
            "no_endpoint",
            f"{name} is not set: this job's stage reserves no pool of the endpoint service "
            f"{service!r}, or the process that started this one did not pass the connector on",
        )
    with _lock:
        # Keyed by the value too: a process whose environment names another descriptor
        # (a test, a re-exec) gets a connector for that one.
        conn = _connectors.get((service, value))
        if conn is not None:
            return conn
        transport = current()
        try:
            fd = transport.parse(value)
            sock = transport.open_stream(fd)
        except UnsupportedHandle as exc:
            raise EndpointError("bad_endpoint", f"{name}={value!r} is not usable: {exc}") from None
        conn = _connectors[(service, value)] = _Connector(service, MessageStream(sock, transport))
        return conn


def _forget_connectors() -> None:
    """Close every connector this process opened, and the idle connections ``request()``
    kept (tests only: the agent owns their lifetime)."""
    pools.close_all()
    with _lock:
        for conn in _connectors.values():
            conn.stream.close()
        _connectors.clear()


def available(service: str) -> bool:
    """Whether this process holds a usable connector to ``service``: ``OARBANK_SERVICE_<NAME>``
    is set and names an open stream (the stage reserves a pool of that endpoint service and
    the connector was passed on). Never raises; opens nothing."""
    value = os.environ.get(env_name(service))
    if not value:
        return False
    transport = current()
    try:
        return transport.is_stream(transport.parse(value))
    except (UnsupportedHandle, OSError):
        return False


def connect(service: str, timeout: float | None = None) -> socket.socket:
    """A fresh connected stream to ``service`` (e.g. ``"model"``), brokered by the agent.

    ``timeout`` bounds the whole exchange in seconds (None: wait as long as the agent does; it
    answers ``service_unavailable`` after the service's ``start_timeout_s``). Thread-safe.
    The caller owns the returned socket (blocking mode) and must close it.

    Raises ``EndpointError`` with ``code``: an agent refusal (``service_unavailable``,
    ``rate_limited``, ``bad_pid``, ``bad_request``; retry later or give up; ``refused`` when
    the agent named no code), ``no_endpoint`` (``OARBANK_SERVICE_<NAME>`` unset: fix the
    stage's pools or pass the connector on), ``bad_endpoint`` (set, but no open stream under
    it), ``bad_message`` (a bad reply), ``timeout``; ``ChannelClosed`` once the agent has
    closed the connector (the attempt is ending). The codes are upstream's SDK's, ``timeout``
    aside (upstream's ``connect`` takes no timeout).
    """
    return _connector(service).connect(timeout)


def inherit_connector(service: str) -> dict[str, Any]:
    """``subprocess.Popen`` keyword arguments that pass ``service``'s connector to a child:
    ``pass_fds`` (Windows: a ``startupinfo`` whose ``handle_list`` holds it), ``close_fds=True``
    and ``env`` (a copy of ``os.environ`` naming it).

    Merge them with your own ``pass_fds``/``env`` when passing several. Parent and child then
    share one stream: do not ``connect`` in both at the same moment. Raises ``EndpointError``
    (``no_endpoint``, ``bad_endpoint``).
    """
    conn = _connector(service)
    transport = current()
    fd = conn.stream.fileno()
    env = dict(os.environ)
    env[env_name(service)] = transport.format(fd)
    return {**transport.inheritable_kwargs(fd), "env": env}


class HTTPConnection(http.client.HTTPConnection):
    """An ``http.client.HTTPConnection`` to an endpoint service.

    Its ``connect()`` asks the agent for a connection instead of dialling anything, so
    keep-alive carries several requests over one connection and, when the service closed it,
    the next request reconnects through the agent. ``connect`` raises ``EndpointError`` like
    the module-level ``connect``; everything else is plain ``http.client``. The Host header is
    the service name. ``timeout`` None (upstream's default): the connect exchange waits as
    long as the agent does, and socket operations block.
    """

    def __init__(self, service: str, timeout: float | None = None) -> None:
        super().__init__(service, timeout=timeout)
        self.service = service

    def connect(self) -> None:
        timeout = self.timeout if isinstance(self.timeout, (int, float)) else None
        self.sock = connect(self.service, timeout=timeout)
        self.sock.settimeout(timeout)

    def set_tunnel(self, *args: Any, **kwargs: Any) -> None:
        raise EndpointError("bad_request", "endpoint connections cannot be tunnelled")


class Headers(dict):  # str -> str, a dict so that json.dumps takes it
    """Response headers: a ``dict`` under lower-cased names, as upstream's is (``json.dumps``
    takes it, iterating yields lower-case names), whose lookups take a name in any case. A
    header sent more than once is one entry, its values joined by ", " (HTTP's own rule);
    ``get_all(name)`` gives them apart. Equal to a mapping or message with the same names (any
    case) and values."""

    def __init__(self, headers: Message | Mapping[str, str] | None = None) -> None:
        super().__init__()
        self._all: dict[str, list[str]] = {}
        for name, value in (headers or {}).items():
            self._all.setdefault(name.lower(), []).append(value)
        for name, values in self._all.items():
            super().__setitem__(name, ", ".join(values))

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __setitem__(self, name: str, value: str) -> None:
        self._all[name.lower()] = [value]
        super().__setitem__(name.lower(), value)

    def __delitem__(self, name: str) -> None:
        self._all.pop(name.lower(), None)
        super().__delitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)

    def get_all(self, name: str, failobj: Any = None) -> list[str] | Any:
        """Every value sent under ``name``, in order (``failobj`` when there is none)."""
        return list(self._all.get(name.lower(), [])) or failobj

    def get_content_charset(self, failobj: Any = None) -> str | Any:
        """The ``charset`` parameter of Content-Type, lower-cased (``failobj`` if none)."""
        msg = Message()
        msg["Content-Type"] = self.get("content-type", "")
        return msg.get_content_charset(failobj)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Message):
            theirs = list(other.items())
        elif isinstance(other, Mapping):
            theirs = [(str(k), v) for k, v in other.items()]
        else:
            return NotImplemented
        return dict(self) == {k.lower(): v for k, v in theirs}

    __hash__ = None  # mutable, like the dict it is


def _lower_cased(headers: Message | Mapping[str, str] | None) -> Headers:
    return headers if isinstance(headers, Headers) else Headers(headers)


@dataclass(repr=False)
class Response:
    """A complete HTTP response: ``Response(status, headers={}, body=b"", reason="")``.

    The first three fields, in that order and with those defaults, are upstream's (a
    dataclass there too: equal when status, headers and body are); ``reason`` (the status
    line's text, not compared) and ``text`` are ours. ``headers`` (a mapping or a message)
    becomes a ``Headers``: a dict under lower-cased names, lookups in any case. ``json()``
    parses the body.
    """

    status: int
    headers: Message | Mapping[str, str] = field(default_factory=Headers)
    body: bytes = b""
    reason: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        self.headers = _lower_cased(self.headers)

    @property
    def text(self) -> str:
        """The body decoded with the Content-Type charset (UTF-8 when none is given)."""
        # always a Headers after __post_init__
        charset = self.headers.get_content_charset() if isinstance(self.headers, Headers) else None
        return self.body.decode(charset or "utf-8", errors="replace")

    def json(self) -> Any:
        """The body parsed as JSON. Raises ``ValueError`` if it is not JSON."""
        return json.loads(self.body)

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason} ({len(self.body)} bytes)>"


def request(
    service: str,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float | None = REQUEST_TIMEOUT_S,
) -> Response:
    """One HTTP/1.1 request to ``service``, over a kept-alive brokered connection.

    Connections are pooled per service (``endpoint/pool.py``: at most 8 idle, thread-safe):
    a request reuses an idle one, or asks the agent for a new one; after a complete response
    the connection goes back to the pool unless the service said it closes it. A reused
    connection found closed before any byte of the response arrived (the service closed it
    while idle) is retried once on a fresh one. ``headers`` with ``Connection: close`` gets
    a connection of its own, closed after the response.

    ``body``: dict or list sent as JSON with ``Content-Type: application/json`` (unless
    ``headers`` sets one); str sent UTF-8 encoded; None for no body; anything else as
    ``http.client`` sends it: bytes-like as-is, a file object (``read()``) or an iterable of
    bytes streamed (chunked unless ``headers`` gives a Content-Length). A streamed body is
    read once, so it goes on a fresh connection, never retried.
    ``timeout`` (seconds) bounds the connect exchange and each socket operation.
    Any status is returned, not raised. Raises ``EndpointError`` (see ``connect``),
    ``TypeError`` for a body ``http.client`` cannot send (neither bytes-like, readable nor
    iterable), ``OSError``/``http.client.HTTPException`` when the service breaks the
    connection or the protocol.
    """
    hdrs = dict(headers or {})
    names = {k.lower() for k in hdrs}
    data: Any
    streamed = False
    if body is None:
        data = None
    elif isinstance(body, (bytes, bytearray, memoryview)):
        data = bytes(body)
    elif isinstance(body, str):
        data = body.encode("utf-8")
    elif isinstance(body, (dict, list)):
        data = json.dumps(body).encode("utf-8")
        if "content-type" not in names:
            hdrs["Content-Type"] = "application/json"
    else:
        data, streamed = _other_body(body), True
    closing = any(k.lower() == "connection" and "close" in v.lower() for k, v in hdrs.items())
    pool = None
    if not closing:
        _connector(service)  # no_endpoint here, before anything is pooled under its name
        pool = pools.pool_for(service, os.environ[env_name(service)])
    # The pool holds only what this function gave it: HTTPConnections. A streamed body cannot
    # be sent twice: it takes a fresh connection (which is never retried).
    reused = cast("HTTPConnection | None",
                  pool.take() if pool is not None and not streamed else None)
    while True:
        conn = reused if reused is not None else HTTPConnection(service, timeout=timeout)
        try:
            resp = _exchange(conn, method, path, data, hdrs, timeout, reused=conn is reused)
        except _ClosedUnanswered:
            conn.close()
            reused = None
            continue  # the one retry, on a fresh connection (which never raises this)
        except BaseException:
            conn.close()
            raise
        payload = _read_body(conn, resp)
        if pool is not None and not resp.will_close:
            pool.give(conn)
        else:
            conn.close()
        return Response(resp.status, resp.headers, payload, resp.reason)


def _other_body(body: Any) -> Any:
    """``body`` as ``http.client`` takes it (bytes-like, readable or iterable), or
    ``TypeError`` before anything is connected."""
    try:
        return bytes(memoryview(body))  # any other buffer (array.array, mmap...): its bytes
    except TypeError:
        pass
    if hasattr(body, "read"):
        return body
    try:
        iter(body)
    except TypeError:
        raise TypeError(
            f"body must be bytes-like, str, dict, list, a file object, an iterable of bytes "
            f"or None, not {type(body).__name__}") from None
    return body


class _ClosedUnanswered(Exception):
    """The connection turned out closed before any byte of the response arrived."""


def _exchange(conn: HTTPConnection, method: str, path: str, data: Any,
              hdrs: dict[str, str], timeout: float | None, *,
              reused: bool) -> http.client.HTTPResponse:
    """Send the request on ``conn`` and read the response head. Raises ``_ClosedUnanswered``
    when ``conn`` was ``reused`` and the service had closed it before a byte of a response
    came; a fresh connection raises what happened."""
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    try:
        conn.request(method, path, body=data, headers=hdrs)
    except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
        # Writing failed: the service closed it. Whatever it wrote before closing would be a
        # response; only with none waiting may the request go again elsewhere.
        if reused and conn.sock is not None and _nothing_waiting(conn.sock):
            raise _ClosedUnanswered() from None
        raise
    try:
        return conn.getresponse()
    except http.client.RemoteDisconnected:
        if not reused:
            raise
        # End of file where the status line should start: not one byte of a response came.
        # Never retry once a byte has arrived: the service may have acted on the request, and
        # sending it again could do it twice (so a reset mid-response is raised, not retried).
        raise _ClosedUnanswered() from None


def _nothing_waiting(sock: socket.socket) -> bool:
    """No byte of an answer waits on ``sock`` (end of file or an error may)."""
    if not pools.readable_now(sock):
        return True
    sock.settimeout(0)  # readable: this peek returns at once
    try:
        return not sock.recv(1, socket.MSG_PEEK)
    except OSError:
        return True  # reset: nothing can be read from it any more


def _read_body(conn: HTTPConnection, resp: http.client.HTTPResponse) -> bytes:
    try:
        return resp.read()
    except BaseException:
        conn.close()  # half a body left in it: never reused
        raise
