"""httpx transports whose every connection is one the agent hands over.

``httpx.Client(transport=HTTPTransport("model"))`` and
``httpx.AsyncClient(transport=AsyncHTTPTransport("model"))``: httpx's own transports over
httpcore's connection pool (keep-alive, limits, thread- and task-safe, timeouts, streaming),
with a network backend that asks the attempt's connector for a connection
(``service_endpoint.connect``) where httpcore would dial TCP. The URL's host names the
service: ``http://model/v1/...`` (a URL naming another host, or ``https``, is refused with
``ValueError`` before anything is sent).

Refusals of the agent come back as httpx's connect errors (``httpx.ConnectError``;
``httpx.ConnectTimeout`` for ``timeout``) whose message names the code (``endpoint service
'model': service_unavailable: ...``) and whose chain of causes (``__cause__``, or
``__context__`` where httpcore re-raises ``from None``) holds the ``EndpointError``: clients
built on httpx (the ``openai`` package) treat them as the connection errors they are, and
retry where they retry those.
"""

from __future__ import annotations

import functools
import socket
import time
from collections.abc import Iterable
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import httpcore
import httpx

from oarbank_sdk.endpoint.errors import EndpointError
from oarbank_sdk.endpoint.job import connect
from oarbank_sdk.endpoint.pool import readable_now

__all__ = ["HTTPTransport", "AsyncHTTPTransport", "check_url"]


def check_service(service: object) -> str:
    """``service`` as a transport takes it: a non-empty name, or ``ValueError``/``TypeError``."""
    if not isinstance(service, str):
        raise TypeError(f"service must be the endpoint service's name (a str), "
                        f"not {type(service).__name__}")
    if not service or any(c in service for c in "/:@ \t\r\n"):
        raise ValueError(f"service must be the endpoint service's name, as in the manifest "
                         f"(URLs are http://<service>/...), not {service!r}")
    return service


def check_url(service: str, scheme: str, host: str) -> None:
    """A URL for ``service``: ``http://<service>/...`` (the host in any case), or
    ``ValueError`` naming what is wrong."""
    if scheme != "http":
        raise ValueError(f"{scheme}://{host}/...: endpoint connections are plain HTTP over a "
                         f"connection the agent hands over: use http://{service}/...")
    if host.lower() != service.lower():
        raise ValueError(f"http://{host}/...: this transport reaches the endpoint service "
                         f"{service!r} only (its URLs are http://{service}/...)")


def _connect_error(service: str, exc: EndpointError) -> Exception:
    text = f"endpoint service {service!r}: {exc.code}: {exc.detail}"
    return httpcore.ConnectTimeout(text) if exc.code == "timeout" else httpcore.ConnectError(text)


# --- sync -------------------------------------------------------------------------------------


class _Stream(httpcore.NetworkStream):
    """One handed connection, for httpcore (blocking socket with per-call timeouts)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            self._sock.settimeout(timeout)
            return self._sock.recv(max_bytes)
        except TimeoutError as exc:
            raise httpcore.ReadTimeout(str(exc) or "read timed out") from exc
        except OSError as exc:
            raise httpcore.ReadError(str(exc)) from exc

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._sock.settimeout(timeout)
            self._sock.sendall(buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout(str(exc) or "write timed out") from exc
        except OSError as exc:
            raise httpcore.WriteError(str(exc)) from exc

    def close(self) -> None:
        self._sock.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("endpoint connections are plain HTTP: no TLS over a "
                                    "connection the agent hands over (and no proxy)")

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self._sock
        if info == "is_readable":  # httpcore asks before reusing an idle connection
            return self._sock.fileno() < 0 or readable_now(self._sock)
        return None


class _Backend(httpcore.NetworkBackend):
    def __init__(self, service: str) -> None:
        self.service = service

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        try:
            sock = connect(self.service, timeout=timeout)
        except EndpointError as exc:
            raise _connect_error(self.service, exc) from exc
        return _Stream(sock)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("endpoint connections are handed over by the agent: "
                                    "there is no socket path to connect to")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _pool_options(limits: httpx.Limits, retries: int) -> dict[str, Any]:
    return {"max_connections": limits.max_connections,
            "max_keepalive_connections": limits.max_keepalive_connections,
            "keepalive_expiry": limits.keepalive_expiry, "http1": True, "http2": False,
            "retries": retries}


class HTTPTransport(httpx.HTTPTransport):
    """``httpx.HTTPTransport`` to the endpoint service ``service``: ``httpx.Client(transport=
    HTTPTransport("model"), base_url="http://model")``. ``limits`` (pool size, keep-alive
    expiry) and ``retries`` (connect attempts, httpcore's) as httpx's. Thread-safe."""

    def __init__(self, service: str, *, limits: httpx.Limits | None = None,
                 retries: int = 0) -> None:
        self.service = check_service(service)
        limits = limits if limits is not None else httpx.Limits(max_connections=100,
                                                                  max_keepalive_connections=20)
        super().__init__(verify=False, limits=limits, retries=retries)
        self._pool.close()  # the TCP pool httpx made: it never opened anything
        self._pool = httpcore.ConnectionPool(network_backend=_Backend(service),
                                             **_pool_options(limits, retries))

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        check_url(self.service, request.url.scheme, request.url.host)
        return super().handle_request(request)

    def __repr__(self) -> str:
        return f"<HTTPTransport to endpoint service {self.service!r}>"


# --- async ------------------------------------------------------------------------------------


class _AsyncStream(httpcore.AsyncNetworkStream):
    """One handed connection as an anyio stream (asyncio or trio), for httpcore."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            with anyio.fail_after(timeout):
                return await self._stream.receive(max_bytes)
        except anyio.EndOfStream:
            return b""
        except TimeoutError as exc:
            raise httpcore.ReadTimeout("read timed out") from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise httpcore.ReadError(str(exc)) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            with anyio.fail_after(timeout):
                await self._stream.send(buffer)
        except TimeoutError as exc:
            raise httpcore.WriteTimeout("write timed out") from exc
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            raise httpcore.WriteError(str(exc)) from exc

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("endpoint connections are plain HTTP: no TLS over a "
                                    "connection the agent hands over (and no proxy)")

    def get_extra_info(self, info: str) -> Any:
        sock = self._stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
        if info == "socket":
            return sock
        if info == "is_readable":
            return sock is None or sock.fileno() < 0 or readable_now(sock)
        return None


class _AsyncBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, service: str) -> None:
        self.service = service

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None
                          ) -> httpcore.AsyncNetworkStream:
        # The exchange with the agent is a short blocking round trip on the connector (under
        # its lock): a worker thread does it, never the event loop. Not abandoned when the
        # caller is cancelled, so the connection it brings is closed, not leaked.
        try:
            sock = await anyio.to_thread.run_sync(
                functools.partial(connect, self.service, timeout=timeout))
        except EndpointError as exc:
            raise _connect_error(self.service, exc) from exc
        try:
            stream = await anyio.abc.UNIXSocketStream.from_socket(sock)
        except BaseException:
            sock.close()
            raise
        return _AsyncStream(stream)

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None
                                  ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("endpoint connections are handed over by the agent: "
                                    "there is no socket path to connect to")

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


class AsyncHTTPTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` to the endpoint service ``service``:
    ``httpx.AsyncClient(transport=AsyncHTTPTransport("model"), base_url="http://model")``
    (asyncio or trio, through anyio). Task-safe; ``limits`` and ``retries`` as httpx's."""

    def __init__(self, service: str, *, limits: httpx.Limits | None = None,
                 retries: int = 0) -> None:
        self.service = check_service(service)
        limits = limits if limits is not None else httpx.Limits(max_connections=100,
                                                                  max_keepalive_connections=20)
        super().__init__(verify=False, limits=limits, retries=retries)
        self._pool = httpcore.AsyncConnectionPool(network_backend=_AsyncBackend(service),
                                                  **_pool_options(limits, retries))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        check_url(self.service, request.url.scheme, request.url.host)
        return await super().handle_async_request(request)

    def __repr__(self) -> str:
        return f"<AsyncHTTPTransport to endpoint service {self.service!r}>"
