"""The agent's one HTTP client for the portal: heartbeats (heartbeat.py) and fleet dispatch
(``oarbank_agent.fleet``) post through ``PortalClient``.

- ``PortalURL``: ``http://HOST:PORT[/prefix]``, ``https://HOST[:PORT][/prefix]`` (verified
  against the system's CAs or ``ca_file``) or ``unix:/path/to/socket``.
- ``PortalClient.post(path, body, timeout_s)``: one ``POST <prefix><path>`` of a JSON body,
  HTTP/1.1 over asyncio streams, ``Connection: close``, the node's token as ``Authorization:
  Bearer``; answers ``(status, body, Retry-After)``. Bounded by ``timeout_s`` (the connection is
  dropped at once when it runs out or the caller is cancelled); a reply is read up to
  ``max_reply`` bytes. Raises ``OSError``, ``PortalError`` (not HTTP) or
  ``asyncio.TimeoutError``.
- ``read_token_file``: the node's token, refused when others may read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import stat
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

from oarbank_agent import platform
from oarbank_agent.platform import fileflags

__all__ = ["Answer", "PortalClient", "PortalError", "PortalURL", "bounded", "read_token_file"]

MAX_REPLY = 64 * 1024
_T = TypeVar("_T")


class PortalError(Exception):
    """The portal's answer was not HTTP."""


class Answer(NamedTuple):
    status: int
    body: bytes
    retry_after: str | None


def read_token_file(path: str) -> str:
    """The node's portal token from ``path``; ``ValueError`` naming what is wrong. A token
    readable by the group or others is refused: whoever reads it can report as this node."""
    try:
        fd = os.open(path, os.O_RDONLY | fileflags.NOFOLLOW)
    except OSError as e:
        raise ValueError(f"{path}: cannot open: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file")
        # who else may read it, as the system keeps it (a mode, a DACL): the backend says
        try:
            why = platform.current().statedir.others_may_read(Path(path), fd)
        except OSError as e:
            raise ValueError(f"{path}: cannot tell who may read it: {e}") from None
        if why is not None:
            raise ValueError(f"{path}: {why}")
        raw = os.read(fd, 4096)
    finally:
        os.close(fd)
    token = raw.decode("utf-8", "replace").strip()
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(f"{path}: expected one token (what `oarbank-portal token issue` "
                         "printed), got " + ("nothing" if not token else "several words"))
    return token


class PortalURL:
    """A parsed portal address; ``ValueError`` with a readable message when it is not one."""

    def __init__(self, url: str) -> None:
        self.text = url
        self.unix_path: str | None = None
        self.host = "localhost"
        self.port = 80
        self.prefix = ""
        self.tls = False
        if url.startswith("unix:"):
            path = url[len("unix:"):]
            if path.startswith("//"):
                path = path[2:]
            if not path.startswith("/"):
                raise ValueError(f"portal URL {url!r}: unix: needs an absolute socket path "
                                 "(unix:/path/to/socket)")
            self.unix_path = path
            return
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"portal URL {url!r}: expected http://HOST:PORT, "
                             "https://HOST[:PORT] or unix:/path/to/socket")
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"portal URL {url!r}: bad port") from None
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")

    @property
    def host_header(self) -> str:
        if self.unix_path:
            return "localhost"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def private(self) -> bool:
        """Does a token sent here stay off the network (TLS, a unix socket or loopback)?"""
        return self.tls or self.unix_path is not None or self.host in (
            "localhost", "127.0.0.1", "::1")


class PortalClient:
    """Posts to one portal as this node (its token, its TLS context)."""

    def __init__(self, url: str | PortalURL, *, token: str | None = None,
                 ca_file: str | None = None) -> None:
        self.url = url if isinstance(url, PortalURL) else PortalURL(url)
        self.token = token
        self._ssl: ssl.SSLContext | None = None
        if self.url.tls:
            # The system's CAs, or only the given one (a private CA for the fleet's portal).
            self._ssl = ssl.create_default_context(cafile=ca_file)
        elif ca_file is not None:
            raise ValueError("a CA file is for an https:// portal URL")

    async def post(self, path: str, body: bytes, timeout_s: float, *,
                   max_reply: int = MAX_REPLY) -> Answer:
        return await bounded(self._post(path, body, max_reply), timeout_s)

    async def _post(self, path: str, body: bytes, max_reply: int) -> Answer:
        """(status, body, Retry-After)."""
        u = self.url
        if u.unix_path is not None:
            reader, writer = await platform.current().endpoint.open(u.unix_path)
        else:
            reader, writer = await asyncio.open_connection(
                u.host, u.port, ssl=self._ssl, server_hostname=u.host if self._ssl else None)
        try:
            auth = f"Authorization: Bearer {self.token}\r\n" if self.token else ""
            head = (f"POST {u.prefix}{path} HTTP/1.1\r\n"
                    f"Host: {u.host_header}\r\n"
                    f"{auth}"
                    "Content-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    "Connection: close\r\n"
                    "User-Agent: oarbank-agent\r\n\r\n")
            writer.write(head.encode("ascii") + body)
            await writer.drain()
            status_line = await reader.readline()
            fields = status_line.split(None, 2)
            if len(fields) < 2 or not fields[0].startswith(b"HTTP/") or not fields[1].isdigit():
                raise PortalError(f"not an HTTP reply: {status_line[:80]!r}")
            length = None
            retry_after = None
            while True:
                line = await reader.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length" and value.strip().isdigit():
                    length = int(value.strip())
                elif name.strip().lower() == b"retry-after":
                    retry_after = value.strip().decode("latin-1")
            if length is not None and length > max_reply:
                raise PortalError(f"a reply of {length} bytes, over the {max_reply} expected")
            if length is not None:
                try:
                    reply = await reader.readexactly(length)
                except asyncio.IncompleteReadError as e:
                    raise PortalError(f"the reply ended after {len(e.partial)} of {length} "
                                      "bytes") from None
            else:  # (Connection: close) to the end, bounded
                reply = await reader.read(max_reply + 1)
                while len(reply) <= max_reply and (more := await reader.read(max_reply)):
                    reply += more
                if len(reply) > max_reply:
                    raise PortalError(f"a reply over the {max_reply} bytes expected")
        except BaseException:
            # Timed out, cancelled or broken: drop the connection at once; a graceful close
            # could wait on a portal that reads nothing.
            writer.transport.abort()
            raise
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return Answer(int(fields[1]), reply, retry_after)



async def bounded(coro: Coroutine[Any, Any, _T], timeout: float) -> _T:
    """``coro``'s result, or ``asyncio.TimeoutError`` after ``timeout`` (the work is cancelled).
    A cancel of the caller always propagates (asyncio.wait_for before 3.12 may drop it)."""
    task = asyncio.ensure_future(coro)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()  # its own cleanup (dropping the connection) runs on the next loop turn
        raise asyncio.TimeoutError
    return task.result()
