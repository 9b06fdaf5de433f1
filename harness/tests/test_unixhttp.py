"""requests over a unix socket (how the harness queries a portal serving on one)."""

from __future__ import annotations

import http.server
import socketserver
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.e2e.unixhttp import unix_session

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="no AF_UNIX in Python here")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        body = self.path.encode()
        self.send_response(200 if self.path.startswith("/ok") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        conn, _ = super().get_request()
        return conn, ("unix", 0)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "s.sock"
    srv = _Server(str(path), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield path
    srv.shutdown()
    srv.server_close()
    t.join(5)


def test_get_with_params_and_keep_alive(server: Path) -> None:
    with unix_session(str(server)) as s:
        r = s.get("http://portal/ok/v1/queries/services", params={"module": "m", "node_id": "a"})
        assert r.status_code == 200
        assert r.text == "/ok/v1/queries/services?module=m&node_id=a"
        r2 = s.get("http://portal/missing")
        assert r2.status_code == 404 and r2.text == "/missing"


def test_no_socket_is_a_connection_error(tmp_path: Path) -> None:
    import requests

    with unix_session(str(tmp_path / "absent.sock")) as s, pytest.raises(
            requests.ConnectionError):
        s.get("http://portal/ok", timeout=5)
