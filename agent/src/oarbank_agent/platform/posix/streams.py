"""Streams on POSIX: descriptors watched by the selector event loop, pipes close-on-exec.

The stream type behind the transport is ``socket.socket`` (``oarbank_sdk.protocol``'s
``PosixTransport``); readiness is ``loop.add_reader``/``add_writer``. ``pipe2`` with
``O_CLOEXEC`` where the system has it (Linux); elsewhere (macOS) ``pipe`` and then both ends
made non-inheritable, which is the same for a process that does not fork meanwhile (the
agent's children come from ``subprocess`` or the factory, never from a bare fork).
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from typing import Any

from oarbank_agent.platform.api import Watchable
from oarbank_sdk.protocol import current_transport

__all__ = ["PosixStreams", "LoopWatcher"]


class LoopWatcher:
    """``api.Watcher`` on a selector loop (the POSIX default)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def on_readable(self, stream: Watchable, callback: Callable[..., object],
                    *args: Any) -> None:
        self._loop.add_reader(stream, callback, *args)

    def on_writable(self, stream: Watchable, callback: Callable[..., object],
                    *args: Any) -> None:
        self._loop.add_writer(stream, callback, *args)

    def off_readable(self, stream: Watchable) -> bool:
        return self._loop.remove_reader(stream)

    def off_writable(self, stream: Watchable) -> bool:
        return self._loop.remove_writer(stream)


class PosixStreams:
    """``api.Streams``: sockets, selector readiness; ``cloexec_pipe``: the system has
    ``pipe2`` (Linux) and it is used."""

    kind = socket.socket

    def __init__(self, *, cloexec_pipe: bool) -> None:
        self.cloexec_pipe = cloexec_pipe

    def watcher(self, loop: asyncio.AbstractEventLoop) -> LoopWatcher:
        return LoopWatcher(loop)

    def child_pair(self) -> tuple[socket.socket, socket.socket]:
        return current_transport().pair(child=True)

    def pipe(self) -> tuple[int, int]:
        if self.cloexec_pipe:
            r, w = os.pipe2(os.O_CLOEXEC)
        else:
            r, w = os.pipe()
            os.set_inheritable(r, False)
            os.set_inheritable(w, False)
        os.set_blocking(r, False)  # ours: read when ready (the child's end stays blocking)
        return r, w

    def read_some(self, end: int, size: int) -> bytes | None:
        try:
            return os.read(end, size)
        except BlockingIOError:
            return None

    def close_read_end(self, end: int) -> None:
        os.close(end)
