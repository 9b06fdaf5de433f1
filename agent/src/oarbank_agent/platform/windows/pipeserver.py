"""The control pipe's serving loop on Windows: the proactor's overlapped ``ConnectNamedPipe``
over ``controlpipe`` instances, each under the owner-only DACL from its creation.

asyncio's own ``start_serving_pipe`` makes its instances with the default DACL (readable by
everyone) and returns no ``AbstractServer``, so this is the same loop over our instances: one
free instance always waits (a client never finds the name missing while the agent serves);
when a client takes it, the next is made before the client is handed a stream pair. It uses
the proactor loop's ``_proactor.accept_pipe`` and ``_make_duplex_pipe_transport``, which
``start_serving_pipe`` itself is made of.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import sys
from typing import Any

from oarbank_agent.platform.api import ClientHandler
from oarbank_agent.platform.windows import controlpipe

__all__ = ["PipeServer", "serve_pipe"]

log = logging.getLogger("oarbank_agent.platform.windows.pipeserver")
_winapi: Any = importlib.import_module("_winapi") if sys.platform == "win32" else None


class _Instance:
    """One server instance's handle as the proactor wants it (``fileno``, ``close``)."""

    def __init__(self, handle: int) -> None:
        self._handle: int | None = handle

    def fileno(self) -> int:
        if self._handle is None:
            raise ValueError("the pipe instance is closed")
        return self._handle

    @property
    def handle(self) -> int | None:
        return self._handle

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            with contextlib.suppress(OSError):
                _winapi.CloseHandle(handle)

    def __del__(self) -> None:
        self.close()


class PipeServer(asyncio.AbstractServer):
    """Serves the pipe ``name`` until ``close``; each client gets ``on_client(reader, writer)``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, name: str, on_client: ClientHandler,
                 limit: int) -> None:
        self._loop = loop
        self.name = name
        self._on_client = on_client
        self._limit = limit
        self._free: _Instance | None = _Instance(controlpipe.create_instance(name, first=True))
        self._accepting: asyncio.Future[Any] | None = None
        self._serving = True
        loop.call_soon(self._accept)

    def _accept(self) -> None:
        if not self._serving or self._free is None:
            return
        try:
            future = self._loop._proactor.accept_pipe(self._free)  # type: ignore[attr-defined]
        except OSError as exc:  # e.g. the instance broke: make a fresh one, go on
            log.warning("control pipe %s: accept failed (%s); making a new instance",
                        self.name, exc)
            self._renew()
            self._loop.call_later(0.05, self._accept)
            return
        self._accepting = future
        future.add_done_callback(self._accepted)

    def _renew(self) -> _Instance | None:
        """The free instance leaves (to a client, or broken): make the next one first."""
        taken = self._free
        try:
            self._free = _Instance(controlpipe.create_instance(self.name, first=False))
        except OSError as exc:
            log.error("control pipe %s: cannot make a new instance: %s", self.name, exc)
            self._free = None
        return taken

    def _accepted(self, future: asyncio.Future[Any]) -> None:
        self._accepting = None
        if future.cancelled() or not self._serving:
            return
        exc = future.exception()
        if exc is not None:  # a client that came and went before we saw it: serve the next
            old = self._renew()
            if old is not None:
                old.close()
            self._accept()
            return
        pipe = self._renew()
        assert pipe is not None
        reader = asyncio.StreamReader(limit=self._limit, loop=self._loop)
        protocol = asyncio.StreamReaderProtocol(reader, self._on_client, loop=self._loop)
        self._loop._make_duplex_pipe_transport(  # type: ignore[attr-defined]
            pipe, protocol, extra={"addr": self.name})
        self._accept()

    # -- asyncio.AbstractServer ------------------------------------------------------------------

    def close(self) -> None:
        """No new clients: the waiting instance goes (connected clients are the caller's)."""
        self._serving = False
        accepting, self._accepting = self._accepting, None
        if accepting is not None:
            accepting.cancel()
        free, self._free = self._free, None
        if free is not None:
            free.close()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        """Serving starts at creation."""

    async def serve_forever(self) -> None:
        while self._serving:
            await asyncio.sleep(3600)

    async def wait_closed(self) -> None:
        await asyncio.sleep(0)  # the cancelled accept's completion is handled on the loop


async def serve_pipe(name: str, on_client: ClientHandler, *, limit: int) -> PipeServer:
    """Serve ``name`` on the running (proactor) loop; raises OSError if it cannot be made."""
    loop = asyncio.get_running_loop()
    if not hasattr(loop, "_proactor"):
        raise RuntimeError("the control pipe needs the proactor event loop (Loops.new)")
    return PipeServer(loop, name, on_client, limit)
