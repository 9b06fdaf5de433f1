"""One connector or channel stream: line messages out; line messages plus descriptors in.

Descriptor pairing (POSIX, SCM_RIGHTS over a unix stream socket): a descriptor arrives with
the first byte of the message it was sent with, and one ``recvmsg`` returns at most one
descriptor-carrying segment. So a descriptor received in the chunk of stream bytes
``[a, b)`` belongs to a message that *starts* inside ``[a, b)``. Descriptors are queued with
that range, oldest first, and:

- a message that should carry one (``ok``, ``connection``; the caller says which) takes the
  oldest queued descriptor whose range contains the message's first byte;
- once a message ending at offset ``e`` has been handled, every queued descriptor whose range
  ends at or before ``e`` can belong to no later message: it rode on a message that should
  carry none (or on a malformed one), so it is closed, never used.

Standard library only.
"""

from __future__ import annotations

import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from oarbank_sdk._transport import Transport
from oarbank_sdk._wire import LineSplitter, WireError
from oarbank_sdk.endpoint.errors import ChannelClosed

__all__ = ["MessageStream", "Message"]


class Message(Protocol):
    def line(self) -> bytes: ...

_RECV_SIZE = 65536


class MessageStream:
    """Wraps a connected unix stream socket (owned: ``close`` closes it).

    Not thread-safe: callers serialise ``send``/``next`` with their own lock.
    """

    def __init__(self, sock: socket.socket, transport: Transport) -> None:
        self.sock = sock
        self._t = transport
        self._splitter = LineSplitter()
        # (line or the WireError that replaced it, first byte offset, end offset)
        self._lines: deque[tuple[bytes | WireError, int, int]] = deque()
        # (descriptor, chunk start offset, chunk end offset), in stream order
        self._fds: deque[tuple[int, int, int]] = deque()
        self._pos = 0  # stream offset of the next byte to be received
        self._line_start = 0  # stream offset where the unfinished line began
        self._discarding = False  # inside an over-long line: skip to its newline
        self._closed: ChannelClosed | None = None

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: Message, attach: int | None = None) -> None:
        """Send one message (a wire message: its ``line()``). Raises ``ChannelClosed`` if the
        peer is gone."""
        data = msg.line()
        try:
            if self.sock.gettimeout() == 0.0:  # left non-blocking by a read that did not wait
                self.sock.settimeout(None)
            sent = self._t.send(self.sock, data, attach)
            if sent < len(data):
                self.sock.sendall(data[sent:])
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise ChannelClosed(f"the peer closed the stream ({exc.strerror})") from None
        except OSError:
            if self.sock.fileno() < 0:
                raise ChannelClosed("the stream was closed locally") from None
            raise

    def next(
        self,
        parse: Callable[[bytes], Any],
        wants_fd: Callable[[Any], bool],
        deadline: float | None = None,
    ) -> tuple[Any, int | None]:
        """The next message, parsed (``parse``: a line to a message, raising ``WireError``;
        the wire's ``parse_line_*``), and the descriptor it carried (or None).

        A malformed line comes back as the ``WireError`` instance in place of the message (any
        descriptor that rode on it is closed). Raises ``ChannelClosed`` at end of file and
        ``TimeoutError`` when ``deadline`` (``time.monotonic()``) passes first. The caller owns
        a returned descriptor. A ``deadline`` already passed still returns what has arrived
        (no wait).
        """
        while not self._lines:
            self._fill(deadline)
        line, start, end = self._lines.popleft()
        if isinstance(line, WireError):
            msg: Any = line
        else:
            try:
                msg = parse(line)
            except WireError as exc:
                msg = exc
        fd = None
        if not isinstance(msg, WireError) and wants_fd(msg):
            fd = self._take_fd(start)
            if fd is None:  # Windows: the handle is named in the message itself
                fd = self._t.carried(msg)
        self._drop_fds_before(end)
        return msg, fd

    def close(self) -> None:
        """Close the socket and every descriptor still queued. Idempotent.

        No ``shutdown``: a connector may be shared with child processes, which keep using it.
        """
        self.discard_queued()
        self.sock.close()

    def discard_queued(self) -> None:
        """Close the received descriptors no message has claimed yet."""
        while self._fds:
            _close_fd(self._fds.popleft()[0])

    # --- internals --------------------------------------------------------------------------

    def _fill(self, deadline: float | None) -> None:
        if self._closed is not None:
            raise ChannelClosed(self._closed.detail)
        try:
            if deadline is None:
                if self.sock.gettimeout() is not None:  # two fcntl calls, only when needed
                    self.sock.settimeout(None)
            else:
                # A deadline already passed still takes what has arrived (one read that does
                # not wait): a caller polling from an event loop passes the current time.
                self.sock.settimeout(max(deadline - time.monotonic(), 0.0))
            data, fds = self._t.recv(self.sock, _RECV_SIZE)
        except (ConnectionResetError, BrokenPipeError) as exc:
            data, fds = b"", []
            self._closed = ChannelClosed(f"the stream broke ({exc.strerror})")
        except (TimeoutError, BlockingIOError):
            raise TimeoutError("deadline passed") from None
        except OSError:
            if self.sock.fileno() < 0:  # closed by another thread of ours
                self._closed = ChannelClosed("the stream was closed locally")
                raise self._closed from None
            raise
        start = self._pos
        self._pos += len(data)
        for fd in fds:
            self._fds.append((fd, start, self._pos))
        if not data:
            self.discard_queued()  # nothing can claim them any more
            if self._closed is None:
                partial = self._splitter.pending
                self._closed = ChannelClosed(
                    "end of file" + (f" in the middle of a {partial}-byte message" if partial else "")
                )
            raise ChannelClosed(self._closed.detail)
        self._split(data, start)

    def _split(self, data: bytes, start: int) -> None:
        # Feed the splitter one line at a time: it then never holds more than one line, so an
        # over-long line cannot take complete lines before it down with it.
        i = 0
        while i < len(data):
            nl = data.find(b"\n", i)
            stop = len(data) if nl < 0 else nl + 1
            piece, piece_end = data[i:stop], start + stop
            i = stop
            if self._discarding:
                if nl >= 0:  # the over-long line ends here: back in step
                    self._discarding = False
                    self._line_start = piece_end
                continue
            try:
                lines = self._splitter.feed(piece)
            except WireError as exc:
                self._lines.append((exc, self._line_start, piece_end))
                self._discarding = True
                continue
            if lines:
                self._lines.append((lines[0], self._line_start, piece_end))
                self._line_start = piece_end

    def _take_fd(self, start: int) -> int | None:
        while self._fds and self._fds[0][2] <= start:
            _close_fd(self._fds.popleft()[0])
        if self._fds and self._fds[0][1] <= start < self._fds[0][2]:
            return self._fds.popleft()[0]
        return None

    def _drop_fds_before(self, end: int) -> None:
        while self._fds and self._fds[0][2] <= end:
            _close_fd(self._fds.popleft()[0])


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
