"""``serve_asgi(app)``: an ASGI app (FastAPI, Starlette...) served on the connections the agent
hands over, by uvicorn's own HTTP protocol classes. Nothing listens.

How it runs, in one event loop:

1. uvicorn's ``Config`` is built and loaded (the app imported, its protocol class chosen:
   ``http="auto"`` is httptools where installed, else h11); nothing is bound.
2. The app's lifespan startup runs (where a model loads, in the app's own startup hook or
   lifespan context). If it fails, ``StartupFailed`` is raised: the service never said ready.
3. ``Acceptor.ready()`` (where the agent offers it; the service's ``ready`` op still answers
   from its own marker, which ``on_ready`` may write).
4. The loop reads the channel when it is readable (``Acceptor.accept(timeout=0)``: it takes
   ``ended`` too) and serves each handed connection with uvicorn's protocol through
   ``loop.connect_accepted_socket``: keep-alive, streaming responses, request bodies of any
   size with uvicorn's flow control, the app's exceptions answered 500 by uvicorn.
5. End of file on the channel (the agent is stopping the service), or SIGTERM/SIGINT: open
   connections are asked to close (uvicorn's ``shutdown``: after the response in flight),
   whatever still runs after ``timeout_graceful_shutdown`` is cancelled, then the lifespan
   shutdown runs and ``serve_asgi`` returns. The service should exit then.

The loop's transport owns a duplicate of each connection's descriptor; the acceptor keeps its
own (so that ``ended`` and the per-attempt cap can cut a connection: ``shutdown`` reaches the
transport as end of file, and only the acceptor's copy is closed, never a descriptor the
loop's selector watches). When the transport is lost, the acceptor's copy is closed too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import uvicorn
from uvicorn.server import ServerState

from oarbank_sdk.endpoint.errors import ChannelClosed
from oarbank_sdk.endpoint.service import Acceptor, EndpointSocket

__all__ = ["serve_asgi", "StartupFailed", "REFUSED_OPTIONS"]

log = logging.getLogger("oarbank_sdk.web")

# uvicorn options that bind, listen, fork or speak TLS: none of them has a meaning on a
# connection the agent hands over.
REFUSED_OPTIONS = frozenset({
    "host", "port", "uds", "fd", "backlog", "reload", "reload_dirs", "reload_delay",
    "reload_includes", "reload_excludes", "workers", "ssl_keyfile", "ssl_certfile",
    "ssl_keyfile_password", "ssl_version", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ciphers",
    "ssl_context_factory",
})
LOOPS = ("auto", "asyncio", "uvloop")
GRACEFUL_S = 5.0  # timeout_graceful_shutdown unless given: the agent waits stop_timeout_s


class StartupFailed(RuntimeError):
    """The app's lifespan startup failed: the service is not ready and should exit non-zero."""


def serve_asgi(app: Any, acceptor: Acceptor | None = None, *,
               on_ready: Callable[[], None] | None = None, **options: Any) -> None:
    """Serve ``app`` (an ASGI application, or an import string ``"module:attr"``) on every
    connection the agent hands over; return once the agent closes the channel (or on
    SIGTERM/SIGINT), after the app's lifespan shutdown.

    ``acceptor``: an ``Acceptor`` (default: a new one, which says hello). ``on_ready``: called
    after the lifespan startup succeeded, before the acceptor says ready (write the marker
    your ``ready`` op reads there). ``options``: uvicorn's ``Config`` keywords (``http``,
    ``lifespan``, ``timeout_keep_alive``, ``access_log``, ``log_level``, ``root_path``,
    ``limit_concurrency``, ``h11_max_incomplete_event_size``, ``loop``: ``auto`` (uvloop where
    installed), ``asyncio`` or ``uvloop``...); those that bind, listen,
    fork or speak TLS (``REFUSED_OPTIONS``) raise ``ValueError``, as does an unknown one
    (``TypeError`` from uvicorn). ``proxy_headers`` defaults to False (no proxy in front).

    Handlers see ``scope["client"] == ("attempt-<id>", 0)`` (as ``serve_http``'s handlers see
    ``client_address``). Raises ``StartupFailed`` when the lifespan startup fails,
    ``EndpointError`` (``no_channel``...) when no acceptor is given and none can be made,
    ``TypeError`` for an app that is neither callable nor a string. Blocks; runs its own
    event loop (call it from synchronous code, not from a running loop).
    """
    if not (callable(app) or isinstance(app, str)):
        raise TypeError(f"serve_asgi: app must be an ASGI callable or an import string "
                        f"'module:attr', not {type(app).__name__}")
    if acceptor is not None and not isinstance(acceptor, Acceptor):
        raise TypeError(f"serve_asgi: acceptor must be an oarbank_sdk.service_endpoint.Acceptor, "
                        f"not {type(acceptor).__name__}")
    refused = sorted(REFUSED_OPTIONS & options.keys())
    if refused:
        raise ValueError(f"serve_asgi: {', '.join(refused)}: nothing listens behind the agent "
                         f"(connections are handed over; TLS and workers have no meaning here)")
    options.setdefault("proxy_headers", False)
    graceful = options.pop("timeout_graceful_shutdown", GRACEFUL_S)
    factory = _loop_factory(options.pop("loop", "auto"))
    config = uvicorn.Config(app, **options)
    acc = acceptor if acceptor is not None else Acceptor()
    try:
        _run(_Serving(config, acc, graceful, on_ready).run(), factory)
    finally:
        if acceptor is None:
            acc.close()


def _loop_factory(name: Any) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvicorn's ``loop`` option: ``auto`` is uvloop where installed, else asyncio's."""
    if name not in LOOPS:
        raise ValueError(f"serve_asgi: loop must be one of {', '.join(LOOPS)}, not {name!r}")
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if name == "uvloop":
            raise ValueError("serve_asgi: loop='uvloop' needs the uvloop package") from None
        return None
    return uvloop.new_event_loop


def _run(coro: Coroutine[Any, Any, None],
         factory: Callable[[], asyncio.AbstractEventLoop] | None) -> None:
    if factory is None:
        asyncio.run(coro)
    elif sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(coro)
    else:  # pragma: no cover - Python 3.10
        loop = factory()
        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(coro)
        finally:
            asyncio.set_event_loop(None)
            loop.close()


class _Serving:
    def __init__(self, config: uvicorn.Config, acc: Acceptor, graceful: float | None,
                 on_ready: Callable[[], None] | None) -> None:
        self.config = config
        self.acc = acc
        self.graceful = graceful
        self.on_ready = on_ready
        self.state = ServerState()
        self.starting: set[asyncio.Task[Any]] = set()

    async def run(self) -> None:
        config = self.config
        if not config.loaded:
            config.load()
        lifespan = config.lifespan_class(config)
        await lifespan.startup()
        if lifespan.should_exit:
            raise StartupFailed("the app's lifespan startup failed (its error is logged above): "
                                "the service is not ready")
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        protocol = _handed_protocol(config.http_protocol_class)

        def factory(conn: EndpointSocket, attempt: int | str) -> asyncio.Protocol:
            return protocol(conn, attempt, config=config,
                            server_state=self.state, app_state=lifespan.state)

        def take(conn: EndpointSocket, attempt: int | str) -> None:
            try:
                fd = os.dup(conn.fileno())
            except OSError:  # cut already (ended, or the cap) before the loop got to it
                conn.close()
                return
            sock = socket.socket(conn.family, conn.type, conn.proto, fileno=fd)
            task = loop.create_task(
                loop.connect_accepted_socket(lambda: factory(conn, attempt), sock=sock))
            self.starting.add(task)
            task.add_done_callback(lambda t: self._started(t, sock, conn))

        channel = self.acc.fileno()

        def on_channel() -> None:
            # Everything that has arrived on the channel, without waiting: connections go to
            # uvicorn's protocol, `ended` and the per-attempt cap cut connections here too.
            while True:
                try:
                    conn, attempt = self.acc.accept(timeout=0)
                except TimeoutError:
                    return
                except (ChannelClosed, OSError) as exc:  # EOF: the agent is stopping us
                    log.debug("endpoint channel: %s", exc)
                    loop.remove_reader(channel)
                    stop.set()
                    return
                take(conn, attempt)

        signals = _on_signals(loop, stop.set)
        try:
            if self.on_ready is not None:
                self.on_ready()
            say_ready = getattr(self.acc, "ready", None)
            if callable(say_ready):
                say_ready()
            loop.add_reader(channel, on_channel)
            on_channel()  # connections that came during the startup
            await stop.wait()
            loop.remove_reader(channel)
            await self._shutdown()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
        await lifespan.shutdown()

    def _started(self, task: asyncio.Task[Any], sock: socket.socket, conn: EndpointSocket) -> None:
        self.starting.discard(task)
        if task.cancelled() or task.exception() is not None:
            if not task.cancelled():
                log.warning("a handed connection could not be served: %s", task.exception())
            sock.close()
            conn.close()

    async def _shutdown(self) -> None:
        # As uvicorn's Server.shutdown: each connection closes after its response in flight.
        for task in list(self.starting):
            task.cancel()
        for connection in list(self.state.connections):
            connection.shutdown()
        try:
            await asyncio.wait_for(self._drained(), timeout=self.graceful)
        except asyncio.TimeoutError:
            log.error("cancelling %d running task(s): timeout_graceful_shutdown (%ss) passed",
                      len(self.state.tasks), self.graceful)
            for t in list(self.state.tasks):
                t.cancel(msg="timeout_graceful_shutdown passed")
            for connection in list(self.state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.abort()
            await asyncio.sleep(0)  # connection_lost runs: each closes its descriptors

    async def _drained(self) -> None:
        while self.state.connections or self.state.tasks:
            await asyncio.sleep(0.05)


def _on_signals(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> list[int]:
    """SIGTERM and SIGINT stop serving gracefully, as under uvicorn (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return []
    done: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop)
        except (NotImplementedError, RuntimeError, ValueError):
            continue
        done.append(sig)
    return done


_classes: dict[type[Any], type[Any]] = {}


def _handed_protocol(base: type[Any]) -> type[Any]:
    """``base`` (uvicorn's H11Protocol or HttpToolsProtocol) for a handed connection: its
    client is ``("attempt-<id>", 0)``, and the acceptor's copy of the descriptor is closed
    when the connection is lost."""
    cls = _classes.get(base)
    if cls is not None:
        return cls

    def __init__(self: Any, conn: EndpointSocket, attempt: int | str, **kw: Any) -> None:
        base.__init__(self, **kw)
        self._oarbank_conn = conn
        self._oarbank_attempt = attempt

    def connection_made(self: Any, transport: asyncio.BaseTransport) -> None:
        base.connection_made(self, transport)
        self.client = (f"attempt-{self._oarbank_attempt}", 0)

    def connection_lost(self: Any, exc: Exception | None) -> None:
        try:
            base.connection_lost(self, exc)
        finally:
            self._oarbank_conn.close()

    cls = _classes[base] = type(f"Handed{base.__name__}", (base,), {
        "__init__": __init__, "connection_made": connection_made,
        "connection_lost": connection_lost})
    return cls
