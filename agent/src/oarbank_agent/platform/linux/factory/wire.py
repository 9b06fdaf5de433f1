"""Messages between the agent and its factory: a 4-byte big-endian length, then JSON.

Descriptors for a child ride along the first byte of their ``spawn`` message (SCM_RIGHTS,
through the SDK's transport seam ``oarbank_sdk.protocol``). The factory reads each message
with exact-size reads, so a message's descriptors are never taken with another's bytes.

Agent -> factory: ``{"op": "spawn", "id", "argv", "env", "cwd", "umask", "rlimits", "fds",
"join", "ignored"}`` (``fds``: the number each attached descriptor gets in the child, in
order; ``join``: a file the child writes its pid into before anything else, or null;
``ignored``: the signals the agent ignores now, which the child keeps ignored).
Factory -> agent: ``{"op": "hello", "pid"}`` once; per spawn ``{"op": "forked", "id",
"pid"}`` right after the fork, then ``{"op": "started", "id", "pid"}`` or ``{"op": "failed",
"id", "errno", "error"}``; per child ``{"op": "exit", "pid",
"code"}`` (``code`` as ``Popen.returncode``: negative for a signal).
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

from oarbank_sdk.protocol import current_transport

__all__ = ["encode", "Decoder", "recv_message", "send_message", "MAX_MESSAGE"]

MAX_MESSAGE = 16 << 20  # an environment and argv, never more
_HEADER = struct.Struct(">I")


def encode(msg: dict[str, Any]) -> bytes:
    body = json.dumps(msg, separators=(",", ":")).encode()
    return _HEADER.pack(len(body)) + body


class Decoder:
    """Bytes in, whole messages out (the agent's non-blocking side; no descriptors)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            (n,) = _HEADER.unpack_from(self._buf)
            if n > MAX_MESSAGE:
                raise ValueError(f"factory message of {n} bytes")
            if len(self._buf) < _HEADER.size + n:
                break
            body = bytes(self._buf[_HEADER.size:_HEADER.size + n])
            del self._buf[:_HEADER.size + n]
            out.append(json.loads(body))
        return out


def _recv_exact(sock: socket.socket, n: int, fds: list[int]) -> bytes | None:
    transport = current_transport()
    buf = b""
    while len(buf) < n:
        data, got = transport.recv(sock, n - len(buf))
        fds.extend(got)
        if not data:
            return None
        buf += data
    return buf


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One message and the descriptors that came with it (blocking); None at EOF."""
    fds: list[int] = []
    head = _recv_exact(sock, _HEADER.size, fds)
    if head is None:
        return None
    (n,) = _HEADER.unpack(head)
    if n > MAX_MESSAGE:
        raise ValueError(f"agent message of {n} bytes")
    body = _recv_exact(sock, n, fds)
    if body is None:
        return None
    return json.loads(body), fds


def send_message(sock: socket.socket, msg: dict[str, Any]) -> None:
    """Blocking send of a message without descriptors (the factory's side)."""
    sock.sendall(encode(msg))
