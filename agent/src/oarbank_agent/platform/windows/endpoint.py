"""The control endpoint on Windows: a named pipe of a random name, which the endpoint's path
(``<state>/control.sock``, a small file there) records for the agent's own clients.

Windows has no socket files, and a pipe name derived from the path alone could be made
first by anyone who knows the path (squatting: the agent refused, or its clients answered by
another user). So each ``serve`` picks ``\\\\.\\pipe\\oarbank-agent-<h>-<r>``: ``<h>`` the
first 16 hex digits of the SHA-256 of the state dir's case-folded absolute path (which
agent it is, in a pipe listing), ``<r>`` 128 random bits; then it writes that name into the
path (written whole, replacing a stale one). The name is fixed for as long as that agent
serves and unguessable without reading the state dir. A client reads the record, opens the
pipe and checks its owner: its own user, SYSTEM or the administrators, else PermissionError.

Pipe names have room (at most 256 characters; ours are 68); the record's path must fit in
``MAX_PATH`` (259 characters) unless the system has long paths enabled.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import importlib
import os
import re
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from oarbank_agent.platform.api import ClientHandler, EndpointPathTooLong
from oarbank_agent.platform.windows import controlpipe, winapi

__all__ = ["PipeEndpoint", "pipe_name", "read_record", "path_problem", "owner_trusted",
           "MAX_PATH_CHARS"]

_winapi: Any = importlib.import_module("_winapi") if sys.platform == "win32" else None

MAX_PATH_CHARS = 259  # MAX_PATH (260) less the final NUL
PREFIX = "\\\\.\\pipe\\oarbank-agent-"
_NAME = re.compile(re.escape(PREFIX) + r"[0-9a-f]{16}-[0-9a-f]{32}")
_ERROR_PIPE_BUSY = 231


def pipe_name(state_dir: Path, token: str) -> str:
    """The pipe of the agent of ``state_dir`` (absolute) with random ``token`` (32 hex)."""
    digest = hashlib.sha256(os.path.normcase(str(state_dir)).casefold().encode()).hexdigest()
    return f"{PREFIX}{digest[:16]}-{token}"


def read_record(path: Path) -> str:
    """The pipe name ``path`` records. FileNotFoundError: no record; ConnectionRefusedError:
    something there that is not a record (nothing of an agent serves it)."""
    with open(path, "rb") as f:
        text = f.read(512).decode("ascii", "replace").strip()
    if not _NAME.fullmatch(text):
        raise ConnectionRefusedError(errno.ECONNREFUSED,
                                     f"{path} records no agent's control pipe")
    return text


def path_problem(path: Path, *, long_paths: bool) -> str | None:
    """Why the record at ``path`` can never be written or read here, or None (pure)."""
    n = len(str(path))
    if n <= MAX_PATH_CHARS or long_paths:
        return None
    return (f"the control endpoint's record {path} is {n} characters; Windows allows at most "
            f"{MAX_PATH_CHARS} without long paths (LongPathsEnabled): use a shorter "
            f"--state-dir")


def owner_trusted(owner: str, me: str) -> bool:
    """Whether a pipe owned by ``owner`` (a SID or an SDDL alias) may be this user's agent's
    (``me``): our own, SYSTEM's or the administrators' (pure)."""
    return owner == me or owner in controlpipe.TRUSTED_OWNERS


def _write_record(path: Path, name: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(name + "\n")
    os.replace(tmp, path)  # whole or not at all, a stale record replaced


class PipeEndpoint:
    """``api.Endpoint`` as a named pipe under the owner-only DACL (``controlpipe``)."""

    def check(self, path: Path) -> None:
        problem = path_problem(Path(os.path.abspath(path)), long_paths=winapi.long_paths())
        if problem:
            raise EndpointPathTooLong(problem)

    async def serve(self, path: Path, on_client: ClientHandler, *,
                    limit: int) -> asyncio.AbstractServer:
        from oarbank_agent.platform.windows.pipeserver import serve_pipe

        self.check(path)
        name = pipe_name(Path(os.path.abspath(path.parent)), secrets.token_hex(16))
        server = await serve_pipe(name, on_client, limit=limit)
        try:
            _write_record(path, name)  # after the pipe exists: a reader always finds it
        except BaseException:
            server.close()
            raise
        return server

    def connect(self, path: Path, timeout: float | None) -> Any:
        """A ``PipeStream`` (socket-shaped: ``sendall``, ``makefile``, ``settimeout``,
        ``close``; timeouts bound reads), see ``api.Endpoint.connect``."""
        from oarbank_sdk.protocol import PipeStream

        self.check(path)
        name = read_record(path)
        handle = _open(name, path, timeout)
        stream = PipeStream(handle)
        try:
            _check_owner(handle, name)
            stream.settimeout(timeout)
        except BaseException:
            stream.close()
            raise
        return stream

    async def open(self, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """``path``: a pipe name (``\\\\.\\pipe\\...``) or an endpoint's record."""
        name = path if path.startswith("\\\\.\\pipe\\") else read_record(Path(path))
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        transport, _ = await loop.create_pipe_connection(  # type: ignore[attr-defined]
            lambda: protocol, name)
        return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


def _open(name: str, path: Path, timeout: float | None) -> int:
    """A synchronous client handle to ``name``; a busy pipe (every instance taken, for the
    moment the agent makes the next) is waited for within ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return int(_winapi.CreateFile(
                name, _winapi.GENERIC_READ | _winapi.GENERIC_WRITE, 0, _winapi.NULL,
                _winapi.OPEN_EXISTING, 0, _winapi.NULL))
        except FileNotFoundError:
            raise ConnectionRefusedError(
                errno.ECONNREFUSED, f"nothing serves {name}, which {path} records (the agent "
                f"that wrote it is gone)") from None
        except PermissionError:
            raise PermissionError(
                errno.EACCES, f"{name} (recorded in {path}) admits only its agent's user, the "
                f"administrators and SYSTEM") from None
        except OSError as exc:
            if getattr(exc, "winerror", None) != _ERROR_PIPE_BUSY:
                raise
        left_ms = 0xFFFFFFFF - 1 if deadline is None else int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise TimeoutError(errno.ETIMEDOUT, f"{name} stayed busy")
        try:
            _winapi.WaitNamedPipe(name, min(left_ms, 1000))
        except OSError:
            # Only a hint: timed out, gone, or (Wine, now and then) error 676; CreateFile
            # above says what is there.
            time.sleep(0.005)


def _check_owner(handle: int, name: str) -> None:
    owner = controlpipe.owner_of(handle)
    if not owner_trusted(owner, controlpipe.user_sid()):
        raise PermissionError(errno.EACCES, f"{name} belongs to {owner}, not to this user "
                              "(nor to SYSTEM or the administrators): not our agent's pipe")
