"""How handles travel: the one seam between the endpoint protocol and the operating system.

On Linux and macOS a handle value is ``fd:<n>``; streams are ``socketpair(AF_UNIX,
SOCK_STREAM)`` ends and descriptors ride along a message with SCM_RIGHTS. On Windows it is
``handle:<n>``: streams are synchronous duplex pipes, and the sender duplicates a handle into
the receiver and names it in the message (``carried``); ``_winpipe.py`` holds that transport.

Everything that makes a pair (``pair``), names a handle for a child's environment (``format``)
or hands handles to a child (``inheritable_kwargs``) goes through here: the agent, the
conformance kit and the job side alike. Public as ``oarbank_sdk.protocol``.

Standard library only: the service side of the SDK imports this.
"""

from __future__ import annotations

import array
import os
import socket
import stat
import sys
from typing import Protocol

from oarbank_sdk._handles import UnsupportedHandle, parse_scheme

__all__ = ["Transport", "PosixTransport", "current", "UnsupportedHandle", "parse_scheme"]

# How many descriptors one receive may carry. The protocol attaches at most one per message,
# but a hostile peer may attach more: room for several lets us receive and close them all
# rather than have the kernel truncate silently.
_MAX_FDS_PER_RECV = 16
MAX_HANDLES = _MAX_FDS_PER_RECV  # per message, ``send_handles``


class Transport(Protocol):
    scheme: str

    def pair(self, *, child: bool = False) -> tuple[socket.socket, socket.socket]:
        """A connected stream pair (ours, theirs), both blocking and not inherited by children.
        ``child``: ``theirs`` is meant for a child process (made inheritable; pass it with
        ``inheritable_kwargs`` and close our copy once the child is started)."""

    def parse(self, value: str) -> int:
        """``fd:<n>`` -> n. Raises ``UnsupportedHandle``."""

    def format(self, handle: int) -> str:
        """n -> ``fd:<n>``."""

    def open_stream(self, handle: int) -> socket.socket:
        """Wrap an inherited or received handle as a connected stream (takes ownership)."""

    def send(self, sock: socket.socket, data: bytes, attach: int | None = None) -> int:
        """Send ``data`` with ``attach`` travelling along; returns bytes sent (may be partial
        on a non-blocking socket; the handle goes with the first byte)."""

    def recv(self, sock: socket.socket, bufsize: int) -> tuple[bytes, list[int]]:
        """Receive data and any handles that came with it (close-on-exec, owned by caller)."""

    def send_handles(self, sock: socket.socket, data: bytes, handles: list[int]) -> int:
        """``send`` with several handles travelling along (at most ``MAX_HANDLES``; the
        agent's process factory passes a child's stdio and inherited handles this way)."""

    def inheritable_kwargs(self, *handles: int) -> dict:
        """``subprocess.Popen`` keyword arguments that pass ``handles`` (and nothing else) to
        a child: ``pass_fds`` on POSIX, a ``startupinfo`` with a ``handle_list`` on Windows."""

    def carried(self, msg: object) -> int | None:
        """The handle a parsed message names in its own fields (Windows: ``"handle"``, already
        duplicated into us); None where handles ride out of band (POSIX)."""

    def close_handle(self, handle: int) -> None:
        """Close a received handle nobody will use."""

    def is_stream(self, handle: int) -> bool:
        """Whether ``handle`` is a stream this transport opens. Raises ``OSError`` when it is
        not open at all."""


# Made once, as plain ints (the hot path; ``socket``'s flags are enum members, and mixing
# them with an int builds a new enum member on every receive).
_RECV_FLAGS = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))
_RECV_ANC = socket.CMSG_SPACE(_MAX_FDS_PER_RECV * array.array("i").itemsize) \
    if hasattr(socket, "CMSG_SPACE") else 0


class PosixTransport:
    scheme = "fd"

    def pair(self, *, child: bool = False) -> tuple[socket.socket, socket.socket]:
        # Python creates both ends close-on-exec and blocking; ends handed to peers stay
        # blocking (O_NONBLOCK is shared with every holder of the descriptor).
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        if child:
            theirs.set_inheritable(True)
        return ours, theirs

    def parse(self, value: str) -> int:
        return parse_scheme(self.scheme, value, "descriptor number")

    def format(self, handle: int) -> str:
        return f"{self.scheme}:{handle}"

    def open_stream(self, handle: int) -> socket.socket:
        try:
            sock = socket.socket(fileno=handle)
        except OSError as exc:
            raise UnsupportedHandle(f"descriptor {handle} is not an open socket ({exc})") from None
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            sock.detach()
            raise UnsupportedHandle(f"descriptor {handle} is not a unix stream socket")
        sock.set_inheritable(False)
        return sock

    def send(self, sock: socket.socket, data: bytes, attach: int | None = None) -> int:
        if attach is None:
            return sock.send(data)
        fds = array.array("i", [attach])
        return sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])

    def send_handles(self, sock: socket.socket, data: bytes, handles: list[int]) -> int:
        if len(handles) > MAX_HANDLES:
            raise ValueError(f"{len(handles)} handles in one message (at most {MAX_HANDLES})")
        if not handles:
            return sock.send(data)
        fds = array.array("i", handles)
        return sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])

    def recv(self, sock: socket.socket, bufsize: int) -> tuple[bytes, list[int]]:
        flags = _RECV_FLAGS
        data, ancdata, _msg_flags, _ = sock.recvmsg(bufsize, _RECV_ANC, flags)
        if not ancdata:
            return data, []  # the usual case (every message but ok/connection): no handles
        fds: list[int] = []
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                usable = len(payload) - (len(payload) % arr.itemsize)
                arr.frombytes(payload[:usable])
                fds.extend(arr)
        if not flags:  # platforms without MSG_CMSG_CLOEXEC (macOS): set it right away
            for fd in fds:
                os.set_inheritable(fd, False)
        # (MSG_CTRUNC: the kernel dropped descriptors it could not fit; nothing of ours leaked.)
        return data, fds

    def inheritable_kwargs(self, *handles: int) -> dict:
        return {"pass_fds": tuple(handles), "close_fds": True}

    def carried(self, msg: object) -> int | None:
        return None  # descriptors ride with SCM_RIGHTS; a number in a message names nothing

    def close_handle(self, handle: int) -> None:
        os.close(handle)

    def is_stream(self, handle: int) -> bool:
        return stat.S_ISSOCK(os.fstat(handle).st_mode)


_CURRENT: Transport | None = None


def current() -> Transport:
    """The transport of this operating system."""
    global _CURRENT
    if _CURRENT is None:
        if sys.platform == "win32":
            from oarbank_sdk._winpipe import WindowsTransport

            _CURRENT = WindowsTransport()  # type: ignore[assignment]
        else:
            _CURRENT = PosixTransport()
    return _CURRENT
