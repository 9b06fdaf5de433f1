"""`requests` over a unix socket: a small transport adapter.

Why not requests-unixsocket: it has been unmaintained and broke with requests 2.32 (the
adapter API changed to `get_connection_with_tls_context`); this is the thirty lines it takes
to do the same with urllib3's own connection classes, and one dependency fewer.

    s = unix_session("/path/portal.sock")
    s.get("http://portal/v1/queries/services", params={"module": "m"})
"""

from __future__ import annotations

import socket
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool

__all__ = ["unix_session"]


class _UnixConnection(HTTPConnection):
    def __init__(self, path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__("localhost", *args, **kwargs)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout if isinstance(self.timeout, (int, float)) else 30)
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixPool(HTTPConnectionPool):
    def __init__(self, path: str, timeout: Any = None) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def _new_conn(self) -> HTTPConnection:
        return _UnixConnection(self._path, timeout=self.timeout.connect_timeout)


class _UnixAdapter(HTTPAdapter):
    def __init__(self, path: str) -> None:
        super().__init__()
        self._pool = _UnixPool(path)

    def get_connection_with_tls_context(self, request: Any, verify: Any, proxies: Any = None,
                                        cert: Any = None) -> HTTPConnectionPool:
        return self._pool

    def get_connection(self, url: Any, proxies: Any = None) -> HTTPConnectionPool:
        return self._pool

    def request_url(self, request: Any, proxies: Any) -> str:
        return request.path_url

    def close(self) -> None:
        self._pool.close()
        super().close()


def unix_session(path: str) -> requests.Session:
    """A session whose every `http://` request goes to the unix socket at `path`."""
    s = requests.Session()
    s.trust_env = False  # a proxy from the environment must not capture these requests
    adapter = _UnixAdapter(path)
    s.mount("http://", adapter)
    return s
