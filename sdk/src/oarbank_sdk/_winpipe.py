"""Windows pipe handles (``handle:<n>``): the transport ``_transport.current()`` gives there.

On Windows a connection is one end of a synchronous duplex byte pipe. The agent duplicates
each end straight into the process that gets it (``DuplicateHandle``) and names the new
handle in the message itself (``{"ok": true, "conn": n, "handle": h}``, ``{"op":
"connection", ..., "handle": h}``): nothing rides out of band as with SCM_RIGHTS, so
``send`` refuses an ``attach`` and ``recv`` never returns handles.

``PipeStream`` is the socket-shaped object callers get (``recv``, ``send``, ``sendall``,
``makefile``, ``settimeout``, ``shutdown``, ``close``), so ``http.client`` and
``http.server`` run over it unchanged.

**One thread at a time.** Windows serialises I/O on a synchronous handle: a write from one
thread waits while another thread's read is blocked in the kernel. So a read never blocks
there: it peeks (``PeekNamedPipe``) until bytes, end of file or its deadline come, backing
off from 0 to 20 ms between peeks, and only then reads what is waiting. Even so, use a
stream from one thread at a time (or one reader and one writer, as the endpoint's
connector and channel do under their locks). A write is not bounded by the timeout: it
returns once the pipe's buffer (64 KiB) took the bytes.

``pair()`` (the agent and the conformance kit make connections with it) is a duplex pipe
nobody else can open by name: a random name, first instance only, one instance, remote
clients rejected, opened at once with ``CreateFile``, then the server end checked with
``GetNamedPipeClientProcessId`` to be our own client (another opener gets error 231).

Standard library only (``_winapi``; ``ctypes`` for the one call ``_winapi`` lacks, in
``pair`` only, which the service side never calls).
"""

from __future__ import annotations

import importlib
import io
import os
import secrets
import socket
import sys
import threading
import time
from typing import Any

from oarbank_sdk._handles import UnsupportedHandle, parse_scheme

__all__ = ["PipeStream", "WindowsTransport", "connected_pipe", "duplicate_into", "close_in"]

# Windows only, reached as Any: the module imports (and type-checks) on every system; only
# its calls need Windows (``_transport.current`` picks it there).
_winapi: Any = importlib.import_module("_winapi") if sys.platform == "win32" else None
_set_handle_inheritable: Any = getattr(os, "set_handle_inheritable", None)
_get_handle_inheritable: Any = getattr(os, "get_handle_inheritable", None)

_FILE_TYPE_PIPE = 3
_PIPE_REJECT_REMOTE_CLIENTS = 0x8
_FILE_FLAG_FIRST_PIPE_INSTANCE = 0x00080000
_BUFFER = 65536
_MAX_BACKOFF_S = 0.02


class PipeStream:
    """A socket-shaped stream over one synchronous pipe handle (owned: ``close`` closes it).

    One thread at a time (see the module's docstring). Timeouts bound reads only.
    ``attempt`` and the acceptor's bookkeeping are set on connections a service accepts."""

    family = None
    type = None
    proto = 0
    attempt: int | str | None = None
    _forget: Any = None

    def __init__(self, handle: int) -> None:
        self._handle: int | None = handle
        self._timeout: float | None = None
        self._io_refs = 0
        self._closed = False
        self._shut_read = False  # shutdown(SHUT_RD/RDWR): reads see end of file
        self._use = threading.Lock()  # a read's peek+read, and close, never overlap

    # --- socket's surface ---------------------------------------------------------------------

    def fileno(self) -> int:
        return -1 if self._handle is None else self._handle

    def gettimeout(self) -> float | None:
        return self._timeout

    def settimeout(self, timeout: float | None) -> None:
        if timeout is not None and timeout < 0:
            raise ValueError("Timeout value out of range")
        self._timeout = timeout

    def setblocking(self, flag: bool) -> None:
        self._timeout = None if flag else 0.0

    def getblocking(self) -> bool:
        return self._timeout != 0.0

    def get_inheritable(self) -> bool:
        return bool(_get_handle_inheritable(self._live()))

    def set_inheritable(self, inheritable: bool) -> None:
        _set_handle_inheritable(self._live(), inheritable)

    def setsockopt(self, *args: Any) -> None:
        """Nothing to set on a pipe (``http.server`` may ask for TCP_NODELAY)."""

    def getpeername(self) -> str:
        return "pipe"

    getsockname = getpeername

    def readable_now(self) -> bool:
        """Whether a read would not wait: bytes, end of file or a broken pipe."""
        with self._use:
            return self._peek() != 0

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        delay = 0.0
        while True:
            with self._use:
                avail = self._peek()
                if avail < 0:
                    return b""
                if avail > 0:
                    size = min(bufsize, avail)
                    if flags & socket.MSG_PEEK:
                        return _winapi.PeekNamedPipe(self._live(), size)[0]
                    return self._read(size)
            if deadline is not None and time.monotonic() >= deadline:
                if self._timeout == 0.0:
                    raise BlockingIOError("no bytes waiting on the pipe")
                raise TimeoutError("timed out")
            time.sleep(delay)
            delay = min(max(delay * 2, 0.0002), _MAX_BACKOFF_S)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        view = memoryview(buffer).cast("B")
        data = self.recv(nbytes or len(view), flags)
        view[: len(data)] = data
        return len(data)

    def send(self, data: Any, flags: int = 0) -> int:
        view = memoryview(data).cast("B")
        if not view:
            return 0
        written, _err = _winapi.WriteFile(self._live(), bytes(view[:_BUFFER]))
        return written

    def sendall(self, data: Any, flags: int = 0) -> None:
        view = memoryview(data).cast("B")
        while view:
            view = view[self.send(view):]

    def makefile(self, mode: str = "r", buffering: int | None = None, *,
                 encoding: str | None = None, errors: str | None = None,
                 newline: str | None = None) -> Any:
        """As ``socket.makefile``: the stream stays open until every file made is closed."""
        reading, writing = "r" in mode, "w" in mode
        raw = _PipeIO(self, ("r" if reading else "") + ("w" if writing else ""))
        self._io_refs += 1
        if buffering is None:
            buffering = -1
        if buffering < 0:
            buffering = io.DEFAULT_BUFFER_SIZE
        if buffering == 0:
            if "b" not in mode:
                raise ValueError("unbuffered streams must be binary")
            return raw
        buffered: Any
        if reading and writing:
            buffered = io.BufferedRWPair(raw, raw, buffering)
        elif reading:
            buffered = io.BufferedReader(raw, buffering)
        else:
            buffered = io.BufferedWriter(raw, buffering)
        if "b" in mode:
            return buffered
        text = io.TextIOWrapper(buffered, encoding, errors, newline)
        text.mode = mode  # type: ignore[misc]
        return text

    def shutdown(self, how: int) -> None:
        """``SHUT_RD``/``SHUT_RDWR``: reads here see end of file at once (a thread waiting in
        one wakes). A pipe cannot be half-closed, so the peer sees the end only at ``close``."""
        if self._handle is None:
            raise OSError("the pipe is closed")
        if how in (socket.SHUT_RD, socket.SHUT_RDWR):
            self._shut_read = True

    def detach(self) -> int:
        handle, self._handle = self._handle, None
        self._closed = True
        return -1 if handle is None else handle

    def close(self) -> None:
        forget, self._forget = self._forget, None
        if forget is not None:
            forget()
        self._closed = True
        self._shut_read = True
        if self._io_refs <= 0:
            self._real_close()

    def __enter__(self) -> PipeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<PipeStream handle={self.fileno()}>"

    # --- internals ----------------------------------------------------------------------------

    def _decref_io(self) -> None:
        self._io_refs -= 1
        if self._closed and self._io_refs <= 0:
            self._real_close()

    def _real_close(self) -> None:
        with self._use:
            handle, self._handle = self._handle, None
        if handle is not None:
            try:
                _winapi.CloseHandle(handle)
            except OSError:
                pass

    def _live(self) -> int:
        if self._handle is None:
            raise OSError(9, "the pipe is closed")  # EBADF, as a closed socket says
        return self._handle

    def _peek(self) -> int:
        """Bytes waiting (> 0), none yet (0), or end of file / broken (-1). Under ``_use``."""
        if self._shut_read:
            return -1
        try:
            avail, _left = _winapi.PeekNamedPipe(self._live())
        except (BrokenPipeError, ConnectionResetError):
            return -1
        return avail

    def _read(self, size: int) -> bytes:
        try:
            data, _err = _winapi.ReadFile(self._live(), size)
        except (BrokenPipeError, ConnectionResetError):
            return b""
        return data


class _PipeIO(io.RawIOBase):
    """What ``PipeStream.makefile`` buffers: reads and writes go to the stream."""

    def __init__(self, stream: PipeStream, mode: str) -> None:
        super().__init__()
        self._stream = stream
        self._mode = mode

    def readable(self) -> bool:
        return "r" in self._mode

    def writable(self) -> bool:
        return "w" in self._mode

    def readinto(self, b: Any) -> int:
        return self._stream.recv_into(b)

    def write(self, b: Any) -> int:
        return self._stream.send(b)

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        self._stream._decref_io()


class WindowsTransport:
    """``handle:<n>``: the ``_transport.Transport`` of Windows."""

    scheme = "handle"

    def pair(self, *, child: bool = False) -> tuple[PipeStream, PipeStream]:
        server, client = connected_pipe()
        if child:
            _set_handle_inheritable(client, True)
        return PipeStream(server), PipeStream(client)

    def parse(self, value: str) -> int:
        return parse_scheme(self.scheme, value, "handle number")

    def format(self, handle: int) -> str:
        return f"{self.scheme}:{handle}"

    def open_stream(self, handle: int) -> PipeStream:
        try:
            kind = _winapi.GetFileType(handle)
        except OSError as exc:
            raise UnsupportedHandle(f"handle {handle} is not open ({exc})") from None
        if kind != _FILE_TYPE_PIPE:
            raise UnsupportedHandle(f"handle {handle} is not a pipe (file type {kind})")
        _set_handle_inheritable(handle, False)
        return PipeStream(handle)

    def is_stream(self, handle: int) -> bool:
        return _winapi.GetFileType(handle) == _FILE_TYPE_PIPE  # OSError: not open

    def carried(self, msg: Any) -> int | None:
        """The handle a message names (already ours: the agent duplicated it into us)."""
        return getattr(msg, "handle", None)

    def close_handle(self, handle: int) -> None:
        _winapi.CloseHandle(handle)

    def send(self, sock: Any, data: bytes, attach: int | None = None) -> int:
        if attach is not None:
            raise _no_attach()
        return sock.send(data)

    def send_handles(self, sock: Any, data: bytes, handles: list[int]) -> int:
        if handles:
            raise _no_attach()
        return sock.send(data)

    def recv(self, sock: Any, bufsize: int) -> tuple[bytes, list[int]]:
        return sock.recv(bufsize), []

    def inheritable_kwargs(self, *handles: int) -> dict:
        import subprocess

        for handle in handles:
            _set_handle_inheritable(handle, True)
        win_subprocess: Any = subprocess  # STARTUPINFO: Windows only
        info = win_subprocess.STARTUPINFO()
        info.lpAttributeList = {"handle_list": list(handles)}
        return {"startupinfo": info, "close_fds": True}


def connected_pipe(*, overlapped_server: bool = False) -> tuple[int, int]:
    """The handles ``(server, client)`` of a new duplex byte pipe nobody else can open by name
    (``pair`` wraps them; the agent's Windows backend makes its own ends overlapped with
    ``overlapped_server``, to read and write them through its event loop's completion port).
    Neither handle is inheritable."""
    name = rf"\\.\pipe\oarbank-{os.getpid()}-{secrets.token_hex(16)}"
    server = _winapi.CreateNamedPipe(
        name,
        _winapi.PIPE_ACCESS_DUPLEX | _FILE_FLAG_FIRST_PIPE_INSTANCE
        | (_winapi.FILE_FLAG_OVERLAPPED if overlapped_server else 0),
        _winapi.PIPE_WAIT | _PIPE_REJECT_REMOTE_CLIENTS,  # byte type, byte read mode
        1, _BUFFER, _BUFFER, 0, _winapi.NULL)
    try:
        client = _winapi.CreateFile(
            name, _winapi.GENERIC_READ | _winapi.GENERIC_WRITE, 0, _winapi.NULL,
            _winapi.OPEN_EXISTING, 0, _winapi.NULL)
    except OSError:
        _winapi.CloseHandle(server)
        raise
    try:
        opener = _client_pid(server)
        if opener != os.getpid():
            raise OSError(f"pipe {name} was opened by process {opener}, not by us")
    except BaseException:
        _winapi.CloseHandle(client)
        _winapi.CloseHandle(server)
        raise
    return server, client


_PROCESS_DUP_HANDLE = 0x0040
_DUPLICATE_CLOSE_SOURCE = 0x1
_DUPLICATE_SAME_ACCESS = 0x2


def duplicate_into(pid: int, handle: int) -> int:
    """A copy of our ``handle`` in process ``pid`` (not inheritable there); its value there:
    how an end reaches the process that uses it (the agent's hand-over, the kit's)."""
    target = _winapi.OpenProcess(_PROCESS_DUP_HANDLE, False, pid)
    try:
        return int(_winapi.DuplicateHandle(_winapi.GetCurrentProcess(), handle, target, 0,
                                           False, _DUPLICATE_SAME_ACCESS))
    finally:
        _winapi.CloseHandle(target)


def close_in(pid: int, handle: int) -> None:
    """Close ``handle`` inside process ``pid`` (a copy we put there and nobody was told of);
    a process gone took its handles with it."""
    try:
        target = _winapi.OpenProcess(_PROCESS_DUP_HANDLE, False, pid)
    except OSError:
        return
    try:
        dup = _winapi.DuplicateHandle(target, handle, _winapi.GetCurrentProcess(), 0, False,
                                      _DUPLICATE_CLOSE_SOURCE | _DUPLICATE_SAME_ACCESS)
        _winapi.CloseHandle(dup)
    except OSError:
        pass
    finally:
        _winapi.CloseHandle(target)


def _no_attach() -> ValueError:
    return UnsupportedHandle("on Windows a handle does not ride along a message: the sender "
                             "duplicates it into the receiver and names it in the message")


def _client_pid(server: int) -> int:
    import ctypes
    from ctypes import wintypes

    ct: Any = ctypes  # WinDLL, WinError: Windows only
    kernel32 = ct.WinDLL("kernel32", use_last_error=True)
    pid = wintypes.ULONG()
    if not kernel32.GetNamedPipeClientProcessId(wintypes.HANDLE(server), ctypes.byref(pid)):
        raise ct.WinError(ct.get_last_error())
    return int(pid.value)
