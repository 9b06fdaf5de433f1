"""The portal on uvicorn: TCP (``HOST:PORT``, optionally TLS) or a unix socket (``PATH``).

The sockets are bound here, before uvicorn starts, so ``--listen HOST:0`` knows its port (the
``serving on`` line carries it) and a unix socket path a dead portal left is replaced while a
live one is refused.

Limits, and why: the read timeout closes a connection whose request head has not arrived in
time (uvicorn itself only times out idle keep-alive connections; a client that sends half a
head would hold its slot forever); the same timeout bounds the body (asgi.py);
``limit_concurrency`` answers 503 beyond that many open connections instead of taking all of
them on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # the C parser and loop (uvicorn[standard]): about twice the requests per CPU second
    import uvloop  # noqa: F401
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Fast
except ImportError:  # pragma: no cover - pure-Python fallback, same behaviour
    _Fast = None  # type: ignore[assignment,misc]

from .app import Portal
from .asgi import build_app, is_claim_post, is_heartbeat_post
from .hosts import default_hosts

__all__ = ["ServeOptions", "bind", "serve", "serve_workers"]

log = logging.getLogger("oarbank_ui.server")


class _HeadDeadline:
    """Mixed into uvicorn's HTTP/1.1 protocol (httptools or h11): a deadline on each request
    head (see the module docstring). Relies on ``cycle`` changing when a new request starts,
    which both of uvicorn's protocols do. One timer per connection at a time, re-armed for the
    rest of the current wait when it fires early: a keep-alive connection's requests only
    note when each wait began (a timer made and cancelled per request cost more)."""

    cycle: Any
    loop: Any
    transport: Any

    _head_timer: asyncio.TimerHandle | None = None
    _head_since: float | None = None  # when the wait for the next head began; None: it is in
    head_timeout_s = 10.0  # serve() sets it from --read-timeout-s in a subclass

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        if transport.get_extra_info("socket") is not None:
            sock = transport.get_extra_info("socket")
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                # headers and body may go in two writes (answers but a report's): without
                # this a keep-alive client's delayed ACK adds ~40 ms to every answer
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._await_head()

    def _await_head(self) -> None:
        self._head_cycle = self.cycle
        self._head_since = self.loop.time()
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _head_late(self) -> None:
        self._head_timer = None
        since = self._head_since
        if since is None or self.cycle is not self._head_cycle:
            return  # the head is in; the next wait arms a timer again
        left = since + self.head_timeout_s - self.loop.time()
        if left > 0:  # armed for an earlier wait: this one has the rest of its time
            self._head_timer = self.loop.call_later(left, self._head_late)
            return
        log.debug("closing a connection whose request head took over %g s",
                  self.head_timeout_s)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)  # type: ignore[misc]
        if self._head_since is not None and self.cycle is not self._head_cycle:
            self._head_since = None  # the head is in: the body has its own deadline (asgi*.py)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self._head_since is None and not self.transport.is_closing():
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)  # type: ignore[misc]


class _HeldHead:
    """The transport a report's (or claim's) response cycle writes to: the status line and headers are held
    and go out with the body, so the answer is one send (one syscall, one packet), where
    uvicorn writes the head and the body apart. Anything else passes through."""

    __slots__ = ("_head", "_transport")

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self._head = b""

    def write(self, data: bytes) -> None:
        if not self._head and data.startswith(b"HTTP/1.1 ") and data.endswith(b"\r\n\r\n"):
            self._head = data  # the body's write comes next, in the same send() of the app
            return
        if self._head:
            data, self._head = self._head + data, b""
        self._transport.write(data)

    def close(self) -> None:  # a cycle that closes after its head (an app's error) sends it
        if self._head:
            self._transport.write(self._head)
            self._head = b""
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _OneSend:
    """Mixed into uvicorn's httptools protocol: a report's or a claim's cycle writes through
    ``_HeldHead``.
    Relies on the cycle keeping its ``transport`` and ``scope`` as attributes (uvicorn's do);
    a request that waits for ``100 Continue`` is left as it is (that line must go alone)."""

    cycle: Any
    scope: Any

    def on_headers_complete(self) -> None:
        super().on_headers_complete()  # type: ignore[misc]
        cycle = self.cycle
        if (cycle is not None and cycle.scope is self.scope
                and not getattr(cycle, "waiting_for_100_continue", True)
                and (is_heartbeat_post(cycle.scope) or is_claim_post(cycle.scope))):
            cycle.transport = _HeldHead(cycle.transport)


def _protocol(head_timeout_s: float) -> type:
    bases = (_HeadDeadline, _OneSend, _Fast) if _Fast is not None else (_HeadDeadline,
                                                                         H11Protocol)
    return type("Protocol", bases, {"head_timeout_s": head_timeout_s})


@dataclass
class ServeOptions:
    listen: str | None = None  # HOST:PORT
    unix: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    allowed_hosts: list[str] = field(default_factory=list)  # empty: the default for the address
    read_timeout_s: float = 10.0
    max_connections: int = 1000
    # Requests answered at once (the thread pool): as many as the store has connections, so a
    # request never holds a thread only to wait for a connection (more threads would only
    # fight over the GIL and the pool's lock).
    threads: int = 10
    verbose: bool = False


@dataclass
class Bound:
    sock: socket.socket
    url: str
    hosts: list[str]
    unix_path: Path | None


def bind(opts: ServeOptions) -> Bound:
    """The listening socket, the URL it serves and the Host names it answers."""
    scheme = "https" if opts.tls_cert else "http"
    if opts.unix is not None:
        path = Path(opts.unix)
        _clear_stale_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
        except OSError:
            sock.close()
            raise
        return Bound(sock, f"unix:{path}", opts.allowed_hosts or default_hosts(None, None), path)
    host, sep, port = (opts.listen or "").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"--listen: expected HOST:PORT such as 127.0.0.1:8470, "
                         f"got {opts.listen!r}")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, int(port)), family=family, backlog=2048)
    got = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return Bound(sock, f"{scheme}://{shown}:{got}", opts.allowed_hosts or default_hosts(host, got),
                 None)


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


def serve(portal: Portal, bound: Bound, opts: ServeOptions, *,
          on_started: Callable[[], None] | None = None, owner: bool = True) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn's handlers: open requests finish, then exit).
    ``on_started`` (default: print the ``serving on`` line) runs once requests are accepted;
    ``owner``: this process closes the socket for good (removes a unix socket's file)."""
    config = uvicorn.Config(
        build_app(portal, read_timeout_s=opts.read_timeout_s),
        http=_protocol(opts.read_timeout_s), loop="uvloop" if _Fast is not None else "asyncio",
        ws="none",
        lifespan="off", access_log=opts.verbose, log_config=None,
        limit_concurrency=opts.max_connections, timeout_keep_alive=5,
        timeout_graceful_shutdown=5, ssl_certfile=opts.tls_cert, ssl_keyfile=opts.tls_key,
        server_header=False, date_header=False, proxy_headers=False)
    config.load()  # TLS files are read here: a bad one fails before "serving on"
    server = uvicorn.Server(config)
    started = on_started or (lambda: print(f"oarbank-portal: serving on {bound.url}",
                                           flush=True))

    async def run() -> None:
        import anyio.to_thread

        anyio.to_thread.current_default_thread_limiter().total_tokens = opts.threads
        task = asyncio.ensure_future(server.serve(sockets=[bound.sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started:
            started()
        await task

    # uvicorn handles SIGTERM/SIGINT while it serves, then re-raises the signal to the handler
    # that was there before: make that one a no-op so a stop asked for exits 0, not -15.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    try:
        _run_loop(run())
    finally:
        bound.sock.close()
        if owner and bound.unix_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(bound.unix_path)


def _run_loop(coro: Any) -> None:
    # uvloop when installed (uvicorn's loop setting covers only uvicorn.run; we run the loop)
    if _Fast is not None:
        import uvloop

        if hasattr(asyncio, "Runner"):  # 3.11+
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(coro)
            return
        uvloop.install()
    asyncio.run(coro)


def _say_ready(fd: int) -> None:
    os.write(fd, b"1")


def serve_workers(make_portal: Callable[[], Portal], bound: Bound, opts: ServeOptions,
                  workers: int) -> int:
    """``workers`` processes on one listening socket (the kernel spreads connections), each
    its own event loop, thread pool and store connections: a portal is CPU-bound in Python,
    so more processes is how it uses more cores. The parent only supervises: it prints
    ``serving on`` when every worker accepts, forwards SIGTERM/SIGINT, and exits 0 when they
    have stopped (1 when one died on its own; the rest are stopped then)."""
    ready_r, ready_w = os.pipe()
    children: list[int] = []
    for _ in range(workers):
        pid = os.fork()
        if pid == 0:  # the worker
            os.close(ready_r)
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                portal = make_portal()
                try:
                    serve(portal, bound, opts, owner=False,
                          on_started=lambda: _say_ready(ready_w))
                finally:
                    portal.close()  # os._exit below runs no finalizer: the store's own close
                code = 0
            except BaseException:  # noqa: BLE001 - a worker's end is its exit code
                log.exception("portal worker %d failed", os.getpid())
            finally:
                os._exit(code)
        children.append(pid)
    os.close(ready_w)
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for c in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(c, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    ready = 0
    while ready < workers:
        try:
            got = os.read(ready_r, workers - ready)
        except InterruptedError:
            continue
        if not got:  # every worker closed its end: they died before serving
            break
        ready += len(got)
    os.close(ready_r)
    if ready == workers:
        log.info("%d workers accept requests", workers)
        print(f"oarbank-portal: serving on {bound.url}", flush=True)
    else:
        stop(signal.SIGTERM, None)
    failed = ready != workers
    left = set(children)
    while left:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        left.discard(pid)
        if os.waitstatus_to_exitcode(status) != 0 and not stopping:
            log.error("portal worker %d exited (%s); stopping the others", pid,
                      os.waitstatus_to_exitcode(status))
            failed = True
            stop(signal.SIGTERM, None)
    bound.sock.close()
    if bound.unix_path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bound.unix_path)
    return 1 if failed else 0
