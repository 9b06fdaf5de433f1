"""the keeper's socket on POSIX: a unix socket, mode 0600, whose peer's uid the kernel says
(Linux: ``SO_PEERCRED``; macOS: ``LOCAL_PEERCRED``, getpeereid's source; the darwin profile on
Linux cannot ask it the macOS way: unknown there); messages of one JSON document each, a
descriptor passed with it (SCM_RIGHTS)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oarbank_agent.platform.posix import unixpath

__all__ = ["PosixKeeperHost"]

_HEADER = struct.Struct("!I")
_MAX_DOC = 1 << 20  # a record is a few hundred bytes: anything near this is not ours
_MAX_FDS = 4  # a service's channel end and its log pipe; more is not the keeper's protocol


def _peer_uid(sock: socket.socket) -> int | None:
    """The uid of the process at the other end, from the kernel (never from the peer)."""
    if sys.platform == "darwin":  # getpeereid's source: LOCAL_PEERCRED, a struct xucred
        raw = sock.getsockopt(0, 0x001, 76)  # SOL_LOCAL, LOCAL_PEERCRED
        _version, uid = struct.unpack_from("=II", raw)
        return int(uid)
    creds = getattr(socket, "SO_PEERCRED", None)
    if creds is None:  # the darwin profile on Linux: removed, macOS has no such option
        return None
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, creds,
                                                          struct.calcsize("3i")))
    return int(uid)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the peer closed the keeper's socket")
        buf += chunk
    return buf


class PosixKeeperHost:
    """``api.KeeperHost`` on POSIX. ``started``: a process's start time, as the system
    counts it (None where it cannot tell)."""

    def __init__(self, *, shortcut: bool, started: Callable[[int], int | None]) -> None:
        self.shortcut = shortcut  # long paths through /proc/self/fd (unixpath)
        self._started = started

    def listen(self, path: Path) -> socket.socket:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # never reachable by others, not even before the chmod
        try:
            with unixpath.socket_address(path, shortcut=self.shortcut) as address:
                sock.bind(address)
        except BaseException:
            sock.close()
            raise
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        sock.listen(4)
        return sock

    def connect(self, path: Path, timeout: float) -> socket.socket | None:
        """A connection to the keeper at ``path``; None when none answers there."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            with unixpath.socket_address(path, shortcut=self.shortcut) as address:
                sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            return None
        except BaseException:
            sock.close()
            raise
        return sock

    def peer_uid(self, sock: socket.socket) -> int | None:
        return _peer_uid(sock)

    def send(self, sock: socket.socket, doc: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        body = json.dumps(doc).encode()
        data = _HEADER.pack(len(body)) + body
        sent = socket.send_fds(sock, [data], list(fds))
        if sent < len(data):
            sock.sendall(data[sent:])

    def recv(self, sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
        """One document and the descriptors that came with it (the caller's to close).
        Raises ConnectionError at EOF or on anything not of the keeper's protocol."""
        head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, _MAX_FDS)
        try:
            if not head:
                raise ConnectionError("the peer closed the keeper's socket")
            head += _recv_exact(sock, _HEADER.size - len(head))
            (n,) = _HEADER.unpack(head)
            if n > _MAX_DOC:
                raise ConnectionError(f"a message of {n} bytes: not the keeper's protocol")
            doc = json.loads(_recv_exact(sock, n))
            if not isinstance(doc, dict):
                raise ConnectionError("not the keeper's protocol")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return doc, list(fds)

    def peer_gone(self, end: socket.socket) -> bool:
        """The service closed its side of a held channel end (looked at without reading)."""
        try:
            return end.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def started(self, pid: int) -> int | None:
        return self._started(pid)
