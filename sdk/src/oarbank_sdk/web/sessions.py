"""``session("model")``: a ``requests.Session`` whose every connection is one the agent hands
over.

``EndpointAdapter(service)`` is a ``requests`` ``HTTPAdapter`` over one urllib3 connection
pool (thread-safe, keep-alive, ``pool_maxsize`` idle connections kept, a dropped one replaced
before reuse) whose connections ask the attempt's connector (``service_endpoint.connect``)
instead of dialling TCP. ``session(service)`` mounts it for ``http://<service>/`` and an
adapter that refuses every other URL (naming the service), and ignores the environment's
proxies and netrc (``trust_env = False``): nothing here goes through a proxy.

Refusals of the agent come back as ``requests.ConnectionError`` (``requests.ConnectTimeout``
for ``timeout``) whose cause chain ends in the ``EndpointError`` with its ``code``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import requests
import requests.adapters
import urllib3
from urllib3.connection import HTTPConnection
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from oarbank_sdk.endpoint.errors import EndpointError
from oarbank_sdk.endpoint.job import connect
from oarbank_sdk.web.transports import check_service, check_url

__all__ = ["session", "EndpointAdapter"]


class _Connection(HTTPConnection):
    """A urllib3 connection whose socket comes from the agent."""

    service = ""  # set on the per-service subclass

    def _new_conn(self) -> Any:
        timeout = self.timeout if isinstance(self.timeout, (int, float)) else None
        try:
            return connect(self.service, timeout=timeout)
        except EndpointError as exc:
            text = f"endpoint service {self.service!r}: {exc.code}: {exc.detail}"
            if exc.code == "timeout":
                raise ConnectTimeoutError(self, text) from exc
            raise NewConnectionError(self, text) from exc

    def set_tunnel(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError("endpoint connections go through no proxy")


class _Pool(urllib3.HTTPConnectionPool):
    def __init__(self, service: str, **kw: Any) -> None:
        super().__init__(service, **kw)
        self.ConnectionCls = type("EndpointConnection", (_Connection,), {"service": service})


class EndpointAdapter(requests.adapters.HTTPAdapter):
    """A ``requests`` transport adapter to the endpoint service ``service``; mount it for
    ``http://<service>/``. ``pool_maxsize``: idle connections kept (and, with
    ``pool_block=True``, the most open at once); ``max_retries`` as ``HTTPAdapter``'s."""

    def __init__(self, service: str, *, pool_maxsize: int = requests.adapters.DEFAULT_POOLSIZE,
                 pool_block: bool = False, max_retries: Any = 0) -> None:
        self.service = check_service(service)
        self._endpoint_pool: _Pool | None = None
        super().__init__(pool_connections=1, pool_maxsize=pool_maxsize,
                         max_retries=max_retries, pool_block=pool_block)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False,
                         **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        if self._endpoint_pool is not None:
            self._endpoint_pool.close()
        self._endpoint_pool = _Pool(self.service, maxsize=maxsize, block=block)

    def _pool_for(self, url: str) -> _Pool:
        parts = urlsplit(url)
        check_url(self.service, parts.scheme, parts.hostname or "")
        assert self._endpoint_pool is not None
        return self._endpoint_pool

    def get_connection_with_tls_context(self, request: requests.PreparedRequest, verify: Any,
                                        proxies: Any = None, cert: Any = None) -> Any:
        return self._pool_for(request.url or "")

    def get_connection(self, url: Any, proxies: Any = None) -> Any:  # requests < 2.32.2
        return self._pool_for(str(url))

    def request_url(self, request: requests.PreparedRequest, proxies: Any) -> str:
        return request.path_url  # never a proxy's absolute form

    def close(self) -> None:
        super().close()
        if self._endpoint_pool is not None:
            self._endpoint_pool.close()

    def __repr__(self) -> str:
        return f"<EndpointAdapter to endpoint service {self.service!r}>"


class _Refuse(requests.adapters.BaseAdapter):
    """Every URL that does not name the session's service: refused, naming it."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> Any:
        parts = urlsplit(request.url or "")
        check_url(self.service, parts.scheme, parts.hostname or "")
        raise ValueError(f"{request.url}: this session reaches the endpoint service "
                         f"{self.service!r} only (its URLs are http://{self.service}/...)")

    def close(self) -> None:
        pass


def session(service: str, **adapter_options: Any) -> requests.Session:
    """A ``requests.Session`` to the endpoint service ``service``: ``session("model").post(
    "http://model/v1/generate", json={...}, timeout=30)``. ``adapter_options`` go to
    ``EndpointAdapter`` (``pool_maxsize``, ``pool_block``, ``max_retries``). Close it (or use
    it as a context manager) to close its pooled connections."""
    adapter = EndpointAdapter(service, **adapter_options)
    s = requests.Session()
    s.trust_env = False
    refuse = _Refuse(service)
    s.mount("http://", refuse)
    s.mount("https://", refuse)
    s.mount(f"http://{service.lower()}/", adapter)
    return s
