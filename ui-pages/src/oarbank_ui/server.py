"""The portal behind an HTTP server: TCP (``127.0.0.1:PORT``) or a unix socket (``PATH``).

Standard library ``ThreadingHTTPServer`` (a thread per connection): the portal's work per
request is a few milliseconds of SQLite and Jinja2, so a framework would add a dependency and
nothing we use; the unix-socket variant is a few lines on top of ``socketserver``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import stat
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .app import MAX_BODY, Portal

__all__ = ["PortalHTTPServer", "PortalUnixServer", "make_server"]

log = logging.getLogger("oarbank_ui.server")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "oarbank-portal"

    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            # Headers and body go out in two writes; with Nagle on, a keep-alive client's
            # delayed ACK adds ~40 ms to every answer.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _portal(self) -> Portal:
        return self.server.portal  # type: ignore[attr-defined]

    def _answer(self, method: str) -> None:
        url = urlsplit(self.path)
        body = b""
        if method == "POST":
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                self._send(411, b'{"error": "Content-Length is required"}\n', "application/json")
                return
            n = int(length)
            if n > MAX_BODY:
                self._send(413, b'{"error": "body larger than 1 MiB"}\n', "application/json")
                self.close_connection = True
                return
            body = self.rfile.read(n)
        query = parse_qs(url.query, keep_blank_values=True)
        r = self._portal().handle(method, url.path, query, body)
        self._send(r.status, r.body, r.content_type, r.headers, head=method == "HEAD")

    def _send(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None,
              head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer("GET")

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer("HEAD")

    def do_POST(self) -> None:  # noqa: N802
        self._answer("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._answer("PUT")

    def do_DELETE(self) -> None:  # noqa: N802
        self._answer("DELETE")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("%s %s", self.address_string(), format % args)

    def address_string(self) -> str:
        addr = self.client_address
        return str(addr[0]) if isinstance(addr, tuple) and addr else "unix"


class PortalHTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # open keep-alive connections never hold up shutdown

    def __init__(self, address: tuple[str, int], portal: Portal) -> None:
        self.portal = portal
        super().__init__(address, _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class PortalUnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, portal: Portal) -> None:
        self.portal = portal
        _clear_stale_socket(Path(path))
        super().__init__(path, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, _ = self.socket.accept()
        return conn, ("unix", 0)

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.server_address)  # type: ignore[arg-type]

    @property
    def url(self) -> str:
        return f"unix:{self.server_address}"


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file a dead portal left; refuse a live one or a non-socket file."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(f"{path} exists and is not a socket; not replacing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        path.unlink(missing_ok=True)
        return
    finally:
        probe.close()
    raise OSError(f"another server is answering on {path}")


def make_server(portal: Portal, *, listen: str | None = None,
                unix: str | None = None) -> PortalHTTPServer | PortalUnixServer:
    """``listen`` is ``HOST:PORT`` (port 0 picks a free one); ``unix`` is a socket path."""
    if unix is not None:
        return PortalUnixServer(unix, portal)
    host, sep, port = (listen or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--listen: expected HOST:PORT such as 127.0.0.1:8470, got {listen!r}")
    return PortalHTTPServer((host.strip("[]"), int(port)), portal)
