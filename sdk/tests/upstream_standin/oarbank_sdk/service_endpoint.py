"""A stand-in for upstream's ``oarbank_sdk.service_endpoint``, written here for tests only.

It offers exactly the public names upstream's module offers (``upstream_service_endpoint.json``
beside the tests lists them; ``test_modelserver_portable.py`` checks that this file has those
and no others), with upstream's signatures, defaults, error codes and behaviours where they
differ from ours: attempt ids ``int()``-ed, no ``Acceptor.ready``, one fresh connection with
``Connection: close`` per ``request``, headers a plain dict, handlers given
``("attempt-<id>", 0)`` and the acceptor as their server. Written from those facts, not from
upstream's code; POSIX only (``fd:<n>`` handles), which is all the tests need.

Nothing here is shared with ours (no ``oarbank_sdk._wire``): a module that runs on this runs
without any of our SDK. Standard library only. No ``from`` imports and no future import, so the
module's public namespace is exactly the API (plus the standard modules it imports).
"""

import dataclasses
import http.client
import json
import os
import socket
import sys
import threading

CHANNEL_ENV = "OARBANK_ENDPOINT_CHANNEL"
PREFIX = "OARBANK_SERVICE_"
MAX_LINE = 4096
MAX_PER_ATTEMPT = 64
WINDOWS = sys.platform == "win32"


class EndpointError(RuntimeError):
    def __init__(self, code, detail):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class ChannelClosed(EndpointError):
    def __init__(self, detail="the stand-in's peer closed the stream"):
        super().__init__("closed", detail)


def env_name(service):
    return PREFIX + service.upper()


def available(service):
    return bool(os.environ.get(env_name(service)))


def _fd_of(value):
    scheme, sep, number = value.partition(":")
    if WINDOWS or scheme != "fd" or not sep or not number.isdigit():
        raise EndpointError("bad_endpoint", f"{value!r}: the stand-in takes fd:<n> only")
    return int(number)


class _LineReader:
    """JSON lines in, with the descriptors that rode along; JSON lines out."""

    def __init__(self, sock):
        self._sock = sock
        self._pending = b""
        self._fds = []

    def write(self, message):
        self._sock.sendall(json.dumps(message).encode() + b"\n")

    def read(self):
        while b"\n" not in self._pending:
            if len(self._pending) > MAX_LINE:
                raise EndpointError("bad_message", "the peer sent a line over MAX_LINE")
            data, fds, _flags, _addr = socket.recv_fds(self._sock, MAX_LINE, 4)
            self._fds += fds
            if not data:
                return None
            self._pending += data
        line, _, self._pending = self._pending.partition(b"\n")
        return json.loads(line)

    def descriptor(self):
        if not self._fds:
            raise EndpointError("bad_message", "a message came without its descriptor")
        return self._fds.pop(0)

    def drop_descriptors(self):
        while self._fds:
            os.close(self._fds.pop())

    def close(self):
        self._sock.close()


class _JobSide:
    def __init__(self, service):
        value = os.environ.get(env_name(service))
        if not value:
            raise EndpointError("no_endpoint", f"{env_name(service)} is not set")
        self._lines = _LineReader(socket.socket(fileno=_fd_of(value)))
        self._lock = threading.Lock()

    def connect(self):
        with self._lock:
            try:
                self._lines.write({"op": "connect", "pid": os.getpid()})
                answer = self._lines.read()
            except OSError:
                answer = None
            if answer is None:
                raise ChannelClosed()
            if not answer.get("ok"):
                self._lines.drop_descriptors()
                raise EndpointError(answer.get("error") or "refused", answer.get("detail") or "")
            sock = socket.socket(fileno=self._lines.descriptor())
            self._lines.write({"op": "received", "conn": answer["conn"]})
            return sock


_job_sides = {}
_job_lock = threading.Lock()


def connect(service):
    with _job_lock:
        side = _job_sides.get(service)
        if side is None:
            side = _job_sides[service] = _JobSide(service)
    return side.connect()


class HTTPConnection(http.client.HTTPConnection):
    def __init__(self, service, timeout=None):
        super().__init__("localhost", timeout=timeout)
        self.service = service

    def connect(self):
        self.sock = connect(self.service)
        if self.timeout is not None:
            self.sock.settimeout(self.timeout)


@dataclasses.dataclass
class Response:
    status: int
    headers: dict = dataclasses.field(default_factory=dict)
    body: bytes = b""

    def json(self):
        return json.loads(self.body)


def request(service, method, path, body=None, headers=None, timeout=600):
    sent = dict(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        sent.setdefault("Content-Type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    sent.setdefault("Connection", "close")
    conn = HTTPConnection(service, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=sent)
        resp = conn.getresponse()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def inherit_channel():
    value = os.environ.get(CHANNEL_ENV)
    if not value:
        raise EndpointError("no_channel", f"{CHANNEL_ENV} is not set")
    return {"pass_fds": [_fd_of(value)]}


def _cut(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


class Acceptor:
    def __init__(self, max_per_attempt=MAX_PER_ATTEMPT):
        value = os.environ.get(CHANNEL_ENV)
        if not value:
            raise EndpointError("no_channel", f"{CHANNEL_ENV} is not set")
        fd = _fd_of(value)
        os.environ.pop(CHANNEL_ENV, None)
        self.max_per_attempt = max_per_attempt
        self._lines = _LineReader(socket.socket(fileno=fd))
        self._open = {}
        self._lock = threading.Lock()
        self._lines.write({"op": "hello", "pid": os.getpid()})

    def accept(self):
        while True:
            msg = self._lines.read()
            if msg is None:
                self.close()
                raise ChannelClosed()
            if msg.get("op") == "connection":
                sock = socket.socket(fileno=self._lines.descriptor())
                attempt = int(msg["attempt"])  # as upstream: a string id is a ValueError
                with self._lock:
                    self._lines.write({"op": "accepted", "conn": msg["conn"]})
                    mine = self._open.setdefault(attempt, [])
                    mine.append(sock)
                    while len(mine) > self.max_per_attempt:
                        _cut(mine.pop(0))
                return sock, attempt
            if msg.get("op") == "ended":
                with self._lock:
                    left = self._open.pop(int(msg["attempt"]), [])
                for sock in left:
                    _cut(sock)

    def __iter__(self):
        while True:
            try:
                yield self.accept()
            except ChannelClosed:
                return

    def close(self):
        with self._lock:
            left = [s for socks in self._open.values() for s in socks]
            self._open = {}
        for sock in left:
            _cut(sock)
        self._lines.close()


def serve_http(handler, acceptor=None):
    acc = acceptor or Acceptor()

    def one(sock, attempt):
        try:
            handler(sock, (f"attempt-{attempt}", 0), acc)
        except (OSError, ValueError):
            pass
        finally:
            sock.close()

    for sock, attempt in acc:
        threading.Thread(target=one, args=(sock, attempt), daemon=True).start()
