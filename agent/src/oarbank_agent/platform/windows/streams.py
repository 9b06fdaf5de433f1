"""Streams on Windows: the agent's own pipe ends are overlapped, read and written through the
proactor loop's completion port, and look ready or not as the broker's readiness calls expect.

Windows has no readiness for pipes (nothing says "readable" without reading), and a synchronous
pipe handle serialises its I/O: a read blocked in one thread holds up every write. So the
agent keeps the ends it reads overlapped (``child_pair``: the child's end stays synchronous,
as the SDK's side expects) and ``AgentPipe`` turns completions into the socket-like
non-blocking calls ``MessageStream`` makes:

- reading: while a reader is watched, one overlapped ``ReadFile`` is in flight; its bytes go
  into the pipe's buffer and the reader's callback runs (again on each loop turn while bytes
  are left, as a level-triggered selector would); ``recv`` takes from the buffer, says
  ``BlockingIOError`` when it is empty and ``b""`` at end of file;
- writing: ``send`` starts one overlapped ``WriteFile`` with the whole chunk and says it was
  taken; while it is in flight the next ``send`` says ``BlockingIOError``, and a watched
  writer's callback runs when it completes. A failed write breaks the pipe: the next call
  raises it.

Each transition is written where it happens (``_read_done``, ``_write_done``, ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any

from oarbank_agent.platform.api import Watchable
from oarbank_sdk.protocol import PipeStream, connected_pipe

__all__ = ["AgentPipe", "ProactorWatcher", "WindowsStreams"]

_READ_CHUNK = 65536
_set_handle_inheritable: Any = getattr(os, "set_handle_inheritable", None)
_winapi: Any = __import__("_winapi") if sys.platform == "win32" else None
_msvcrt: Any = __import__("msvcrt") if sys.platform == "win32" else None

# The agent's open pipe ends by handle value: what a watcher is handed (an int or the pipe).
_OPEN: dict[int, AgentPipe] = {}


class AgentPipe:
    """The agent's overlapped end of a pipe to a child (owned: ``close`` closes it)."""

    def __init__(self, handle: int) -> None:
        self._handle: int | None = handle
        self._buffer = bytearray()
        self._eof = False
        self._error: OSError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading: asyncio.Future[Any] | None = None  # the overlapped read in flight
        self._writing: asyncio.Future[Any] | None = None  # the overlapped write in flight
        self._reader: tuple[Callable[..., object], tuple[Any, ...]] | None = None
        self._writer: tuple[Callable[..., object], tuple[Any, ...]] | None = None
        self._fire_scheduled = False
        _OPEN[handle] = self

    # --- socket's surface (what the transport and MessageStream call) -------------------------

    def fileno(self) -> int:
        return -1 if self._handle is None else self._handle

    def setblocking(self, flag: bool) -> None:
        if flag:
            raise ValueError("the agent's pipe ends are never blocking")

    def set_inheritable(self, inheritable: bool) -> None:
        if inheritable:
            raise ValueError("the agent's pipe ends stay the agent's")
        _set_handle_inheritable(self._live(), False)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        if self._buffer:
            data = bytes(self._buffer[:bufsize])
            del self._buffer[:bufsize]
            return data
        if self._error is not None:
            raise self._error
        if self._eof:
            return b""
        self._live()
        raise BlockingIOError("no bytes have arrived on the pipe")

    def send(self, data: Any, flags: int = 0) -> int:
        if self._error is not None:
            raise self._error
        if self._writing is not None:
            raise BlockingIOError("the previous write is still in flight")
        chunk = bytes(data)
        if not chunk:
            return 0
        self._writing = self._proactor().send(self, chunk)
        self._writing.add_done_callback(self._write_done)
        return len(chunk)

    def close(self) -> None:
        """Cancel what is in flight and close the handle. Idempotent."""
        if self._handle is None:
            return
        self._reader = self._writer = None
        for fut in (self._reading, self._writing):
            if fut is not None and not fut.done():
                fut.cancel()  # CancelIoEx; its completion is the proactor's to collect
        _OPEN.pop(self._handle, None)
        handle, self._handle = self._handle, None
        with contextlib.suppress(OSError):
            _winapi.CloseHandle(handle)

    def __repr__(self) -> str:
        return f"<AgentPipe handle={self.fileno()}>"

    # --- watching (ProactorWatcher's side) ---------------------------------------------------

    def watch(self, loop: asyncio.AbstractEventLoop, direction: str,
              callback: Callable[..., object] | None, args: tuple[Any, ...] = ()) -> bool:
        """Set (or, with ``callback`` None, drop) the reader or writer; True if one was set."""
        self._loop = loop
        had = (self._reader if direction == "r" else self._writer) is not None
        entry = None if callback is None else (callback, args)
        if direction == "r":
            self._reader = entry
        else:
            self._writer = entry
        if entry is not None:
            self._step()
        return had

    def _step(self) -> None:
        """After any change: start the read a reader wants, or run the callbacks that are due."""
        if self._handle is None:
            return
        due = ((self._reader is not None and (self._buffer or self._eof or self._error))
               or (self._writer is not None and self._writing is None))
        if due:
            if not self._fire_scheduled:
                self._fire_scheduled = True
                self._loop_now().call_soon(self._fire)
        elif self._reader is not None and self._reading is None:
            self._reading = self._proactor().recv(self, _READ_CHUNK)
            self._reading.add_done_callback(self._read_done)

    def _fire(self) -> None:
        self._fire_scheduled = False
        if self._reader is not None and (self._buffer or self._eof or self._error):
            callback, args = self._reader
            callback(*args)
        if self._writer is not None and self._writing is None and self._handle is not None:
            callback, args = self._writer
            callback(*args)
        self._step()

    def _read_done(self, fut: asyncio.Future[Any]) -> None:
        self._reading = None
        if fut.cancelled():
            return
        try:
            data = fut.result()
        except (BrokenPipeError, ConnectionResetError):
            data = b""  # the child closed its end (or died): end of file
        except OSError as exc:
            self._error = exc
            data = None
        if data:
            self._buffer += data
        elif data is not None:
            self._eof = True
        self._step()

    def _write_done(self, fut: asyncio.Future[Any]) -> None:
        self._writing = None
        if fut.cancelled():
            return
        exc = fut.exception()
        if isinstance(exc, OSError):
            self._error = exc  # the peer is gone: every later call says so
        self._step()

    # --- internals ---------------------------------------------------------------------------

    def _live(self) -> int:
        if self._handle is None:
            raise OSError(9, "the pipe is closed")  # EBADF, as a closed socket says
        return self._handle

    def _loop_now(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _proactor(self) -> Any:
        # ProactorEventLoop's IocpProactor: overlapped ReadFile/WriteFile on a pipe handle,
        # registered with the loop's completion port on first use.
        return self._loop_now()._proactor  # type: ignore[attr-defined]


def _pipe_of(stream: Watchable) -> AgentPipe:
    if isinstance(stream, AgentPipe):
        return stream
    handle = stream if isinstance(stream, int) else stream.fileno()
    try:
        return _OPEN[handle]
    except KeyError:
        raise ValueError(f"handle {handle} is not one of the agent's overlapped pipe ends "
                         "(Windows watches only those: make them with child_pair)") from None


class ProactorWatcher:
    """``api.Watcher`` on the proactor loop, for the agent's overlapped pipe ends."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def on_readable(self, stream: Watchable, callback: Callable[..., object],
                    *args: Any) -> None:
        _pipe_of(stream).watch(self._loop, "r", callback, args)

    def on_writable(self, stream: Watchable, callback: Callable[..., object],
                    *args: Any) -> None:
        _pipe_of(stream).watch(self._loop, "w", callback, args)

    def off_readable(self, stream: Watchable) -> bool:
        return _off(stream, self._loop, "r")

    def off_writable(self, stream: Watchable) -> bool:
        return _off(stream, self._loop, "w")


def _off(stream: Watchable, loop: asyncio.AbstractEventLoop, direction: str) -> bool:
    try:
        pipe = _pipe_of(stream)
    except ValueError:
        return False  # closed already: nothing is watched
    return pipe.watch(loop, direction, None)


class WindowsStreams:
    """``api.Streams`` on Windows: the agent's ends are ``AgentPipe``, children's the SDK's
    synchronous ``PipeStream``."""

    kind = AgentPipe

    def watcher(self, loop: asyncio.AbstractEventLoop) -> ProactorWatcher:
        return ProactorWatcher(loop)

    def child_pair(self) -> tuple[AgentPipe, PipeStream]:
        """(ours, theirs): ours overlapped, for the loop; theirs inheritable, for one child
        (pass it with the transport's ``inheritable_kwargs``, close it once the child runs)."""
        server, client = connected_pipe(overlapped_server=True)
        _set_handle_inheritable(client, True)
        return AgentPipe(server), PipeStream(client)

    def pipe(self) -> tuple[int, int]:
        """(our end's handle: an ``AgentPipe``, a C runtime descriptor of the child's end):
        the child's end a synchronous pipe, as ``subprocess`` hands a descriptor on."""
        server, client = connected_pipe(overlapped_server=True)
        ours = AgentPipe(server)
        try:
            return server, _msvcrt.open_osfhandle(client, 0)
        except BaseException:
            ours.close()
            _winapi.CloseHandle(client)
            raise

    def read_some(self, end: int, size: int) -> bytes | None:
        try:
            return _pipe_of(end).recv(size)
        except BlockingIOError:
            return None
        except ValueError:
            raise OSError(9, f"handle {end} is not an open pipe end of the agent") from None

    def close_read_end(self, end: int) -> None:
        pipe = _OPEN.get(end)
        if pipe is not None:
            pipe.close()
