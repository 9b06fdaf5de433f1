"""The control endpoint on POSIX: a unix socket, mode 0600 from the moment it is bound.

It is bound under a umask of ``0o177`` so that it is never reachable by others, not even
between ``bind`` and ``chmod`` (the agent is single-threaded when it starts serving); a deep
state dir is bound and reached through its directory's descriptor (``unixpath``, Linux) or
refused naming the limit (``shortcut`` off: the macOS profile, which has no ``/proc``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path

from oarbank_agent.platform.api import ClientHandler
from oarbank_agent.platform.posix import unixpath

__all__ = ["UnixEndpoint"]


class UnixEndpoint:
    """``api.Endpoint`` as a unix stream socket."""

    def __init__(self, *, shortcut: bool) -> None:
        self.shortcut = shortcut  # long paths through /proc/self/fd (unixpath)

    def check(self, path: Path) -> None:
        unixpath.check(path, shortcut=self.shortcut)

    async def serve(self, path: Path, on_client: ClientHandler, *,
                    limit: int) -> asyncio.AbstractServer:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket from an agent that died
        old = os.umask(0o177)
        try:
            with unixpath.socket_address(path, shortcut=self.shortcut) as address:
                server = await asyncio.start_unix_server(on_client, path=address, limit=limit)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        return server

    def connect(self, path: Path, timeout: float | None) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # close-on-exec
        try:
            sock.settimeout(timeout)
            with unixpath.socket_address(path, shortcut=self.shortcut) as address:
                sock.connect(address)
        except BaseException:
            sock.close()
            raise
        return sock

    async def open(self, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(path)
