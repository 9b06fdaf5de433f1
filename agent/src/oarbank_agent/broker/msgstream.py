"""One end of a line-based stream on the agent's event loop (a connector or a channel).

Rules this module enforces, whatever the peer does:

- reading never blocks: the backend's readiness watcher (``platform.current().streams``) plus
  the transport's non-blocking ``recv``;
- descriptors a peer attaches to its messages are closed at once and counted, never used;
- a line over the wire cap, EOF, a reset or half-close end the stream through ``on_broken`` or
  ``on_overlong``; the owner decides what that means (refuse, fail the service...);
- writing never blocks and never buffers without bound: what the peer does not take stays in a
  per-stream buffer, and once that passes ``max_out`` bytes the stream is broken ("not reading");
- at most one read's worth of lines waits while the owner has paused delivery, so a busy owner
  (a connect waiting for its service) exerts back-pressure on the peer instead of queueing.

Descriptors we send travel as socket objects: if the owner closed one before it left the
buffer, the message is dropped instead of sending whatever the descriptor number now names.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import deque
from collections.abc import Callable

from oarbank_agent import platform
from oarbank_sdk.protocol import current_transport, wire

__all__ = ["MessageStream"]

log = logging.getLogger("oarbank_agent.broker.handover")

_READ_CHUNK = 65536


class MessageStream:
    """Lines in, lines out, on one non-blocking socket the stream owns."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        *,
        name: str,
        on_line: Callable[[bytes], None],
        on_overlong: Callable[[str], None],
        on_broken: Callable[[str], None],
        max_out: int,
    ) -> None:
        sock.setblocking(False)
        sock.set_inheritable(False)
        self._loop = loop
        self._io = platform.current().streams.watcher(loop)
        self._sock = sock
        self._fd = sock.fileno()
        self._transport = current_transport()
        self.name = name
        self._on_line = on_line
        self._on_overlong = on_overlong
        self._on_broken = on_broken
        self.max_out = max_out
        self._splitter = wire.LineSplitter()
        self._lines: deque[bytes] = deque()
        self._out: deque[tuple[bytes, socket.socket | None]] = deque()
        self.out_bytes = 0
        self._writing = False
        self._paused = False
        self._reading = False
        self.closed = False
        self.foreign_fds_closed = 0

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._set_reading(True)

    def close(self) -> None:
        """Close the socket now; unsent data and queued lines are dropped. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self._set_reading(False)
        if self._writing:
            self._io.off_writable(self._fd)
            self._writing = False
        self._out.clear()
        self.out_bytes = 0
        self._lines.clear()
        self._sock.close()

    def flush_and_close(self) -> None:
        """Best effort: push what the socket takes right now, then close."""
        if not self.closed:
            self._write_some()
        self.close()

    # --- reading ------------------------------------------------------------------------------

    def pause(self) -> None:
        """Stop delivering lines (and reading) until ``resume``: back-pressure on the peer."""
        self._paused = True
        self._set_reading(False)

    def resume(self) -> None:
        if self.closed or not self._paused:
            return
        self._paused = False
        if self._lines:
            # Deliver leftovers from the loop, not from inside the owner's call to resume.
            self._loop.call_soon(self._deliver)
        else:
            self._set_reading(True)

    def _set_reading(self, on: bool) -> None:
        if on and not self._reading and not self.closed:
            self._io.on_readable(self._fd, self._on_readable)
            self._reading = True
        elif not on and self._reading:
            self._io.off_readable(self._fd)
            self._reading = False

    def _on_readable(self) -> None:
        if self.closed:
            return
        try:
            data, fds = self._transport.recv(self._sock, _READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._on_broken(f"receive failed ({exc.strerror or exc})")
            return
        if fds:
            # Peers never send us descriptors; whatever came is closed unused.
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            if self.foreign_fds_closed == 0:
                log.warning(
                    "%s: peer attached %d descriptor(s) to a message: closed, not used",
                    self.name,
                    len(fds),
                )
            self.foreign_fds_closed += len(fds)
        if not data:
            pending = self._splitter.pending
            if pending:
                reason = f"peer closed its end mid-message ({pending} bytes of an unfinished line)"
            else:
                reason = "peer closed its end"
            self._on_broken(reason)
            return
        try:
            lines = self._splitter.feed(data)
        except wire.WireError as exc:
            self._on_overlong(exc.detail)
            return
        if len(lines) == 1 and not self._lines and not self._paused:
            # The hot path (one line a read: a connect, a receipt): no queue, no re-arm.
            self._on_line(lines[0])
            return
        self._lines.extend(lines)
        self._deliver()

    def _deliver(self) -> None:
        while self._lines and not self._paused and not self.closed:
            self._on_line(self._lines.popleft())
        if not self._reading and not self._paused and not self.closed:
            self._set_reading(True)

    # --- writing ------------------------------------------------------------------------------

    def send(self, data: bytes, attach: socket.socket | None = None) -> bool:
        """Queue ``data`` (``attach`` travels with its first byte) and write what fits now.

        Returns False if the stream is closed or broke (``on_broken`` was called).
        """
        if self.closed:
            return False
        if not self._out:
            # Nothing waits ahead (the usual case): one send, no queue. ``attach`` is open here
            # (the caller just made it); the queued path re-checks that for later sends.
            try:
                n = self._transport.send(self._sock, data,
                                         attach=None if attach is None else attach.fileno())
            except (BlockingIOError, InterruptedError):
                n = 0
            except OSError as exc:
                self._on_broken(f"send failed ({exc.strerror or exc})")
                return False
            if n == len(data):
                return True
            # The descriptor went with the first byte; the rest follows without it.
            data, attach = data[n:], (attach if n == 0 else None)
        self._out.append((data, attach))
        self.out_bytes += len(data)
        if not self._writing:
            self._write_some()
        if self.closed:
            return False
        if self.out_bytes > self.max_out:
            self._on_broken(
                f"peer is not reading: {self.out_bytes} bytes wait to be sent (cap {self.max_out})"
            )
            return False
        return True

    def _write_some(self) -> None:
        while self._out and not self.closed:
            data, attach = self._out[0]
            attach_fd: int | None = None
            if attach is not None:
                attach_fd = attach.fileno()
                if attach_fd < 0:
                    # The end this message hands over was closed meanwhile (its connector or
                    # attempt ended): the message means nothing without it.
                    self._out.popleft()
                    self.out_bytes -= len(data)
                    continue
            try:
                n = self._transport.send(self._sock, data, attach=attach_fd)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._on_broken(f"send failed ({exc.strerror or exc})")
                return
            self.out_bytes -= n
            if n < len(data):
                # The descriptor went with the first byte; the rest follows without it.
                self._out[0] = (data[n:], None)
                break
            self._out.popleft()
        want = bool(self._out) and not self.closed
        if want and not self._writing:
            self._io.on_writable(self._fd, self._write_some)
            self._writing = True
        elif not want and self._writing:
            self._io.off_writable(self._fd)
            self._writing = False
