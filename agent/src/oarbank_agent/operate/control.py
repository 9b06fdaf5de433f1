"""The control socket: ``<state>/control.sock``, mode 0600, JSON lines.

Protocol: the client sends one JSON object per line; the agent answers each with one line,
in order. Every answer has ``ok``; a refusal is ``{"ok": false, "code", "error"}``.

| request | answer |
|---|---|
| ``{"op": "submit", "module", "stage", "payload": {...}}`` | ``{"ok": true, "job_id"}`` |
| ``{"op": "wait", "job_id", "timeout"?: s}`` | ``{"ok": true, "job": <record>}`` once finished, |
| | or ``{"ok": false, "code": "timeout", "job": <record>}`` |
| ``{"op": "job", "job_id"}`` | ``{"ok": true, "job": <record>}`` |
| ``{"op": "status"}`` | ``{"ok": true, "status": <Agent.report() + "jobs">}`` |
| ``{"op": "protect", "rule"?: "forbid-gpu" / "allow-gpu" / "evict" / "end-evict"}`` | |
| | ``{"ok": true, "rules": {"gpu_forbidden", "evicted"}, "held": {service key: reason}}`` |

Codes: ``bad_request`` (not JSON, unknown op, wrong field, unknown rule), ``unknown_module``,
``unknown_stage``, ``unknown_job``, ``timeout``, ``shutting_down``, ``gpu_api_missing``
(submit: ``GPU_API_MISSING: needs <apis>; this node provides <have>``, nothing queued),
``exceeds_memory_budget`` (submit: the job could never fit this node's memory budget).
``unsupported_platform`` (submit: the stage, or a service it uses, does not run on this
node's platform; compat.py), ``runner_undetected`` (submit: the module's runner says, in its
``doctor --json``, that this node cannot run it; runnerhealth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from oarbank_agent import platform

__all__ = ["SOCKET_NAME", "ControlError", "ControlServer", "AgentNotRunning", "request",
           "Client"]

SOCKET_NAME = "control.sock"
MAX_REQUEST = 1 << 20  # a payload is small JSON; a megabyte line is a client bug
log = logging.getLogger("oarbank_agent.operate.control")

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ControlError(Exception):
    """A request the agent refused: ``code`` as in the table above."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ControlServer:
    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        # Owner-only from the first moment, a stale one replaced, a deep state dir served
        # as well as the system allows: the backend's (platform.api.Endpoint).
        self._server = await platform.current().endpoint.serve(self.path, self._client,
                                                               limit=MAX_REQUEST)

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()  # no new connections
        # The connected clients first: wait_closed() may wait for every open connection (a
        # `submit --wait` held open would keep the agent from exiting).
        for t in list(self._clients):
            t.cancel()
        if self._clients:
            await asyncio.gather(*self._clients, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    await _answer(writer, {"ok": False, "code": "bad_request",
                                           "error": f"request line over {MAX_REQUEST} bytes"})
                    break
                if not line:
                    break
                try:
                    req = json.loads(line)
                    if not isinstance(req, dict):
                        raise ValueError("request must be a JSON object")
                except ValueError as exc:
                    reply: dict[str, Any] = {"ok": False, "code": "bad_request",
                                             "error": f"not a JSON object: {exc}"}
                else:
                    try:
                        reply = await self._handler(req)
                    except ControlError as exc:
                        reply = {"ok": False, "code": exc.code, "error": str(exc)}
                    except Exception as exc:  # a bug must not take the agent down
                        log.exception("control request %r failed", req.get("op"))
                        reply = {"ok": False, "code": "internal", "error": repr(exc)}
                await _answer(writer, reply)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _answer(writer: asyncio.StreamWriter, reply: dict[str, Any]) -> None:
    writer.write(json.dumps(reply).encode("utf-8") + b"\n")
    await writer.drain()


# --- client (synchronous: the CLI and the demo) ------------------------------------------------


class AgentNotRunning(Exception):
    pass


_KEEP = object()  # Client.call: keep the connection's timeout


class Client:
    """One connection to a running agent; ``call`` sends a request and returns the answer."""

    def __init__(self, state_dir: Path, timeout: float | None = 30.0) -> None:
        path = Path(state_dir) / SOCKET_NAME
        try:
            self.sock = platform.current().endpoint.connect(path, timeout)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise AgentNotRunning(
                f"no agent is running with state dir {state_dir} ({path}: {exc.strerror})"
            ) from None
        self._file = self.sock.makefile("rb")

    def call(self, req: dict[str, Any], timeout: float | None | object = _KEEP) -> dict[str, Any]:
        """Send ``req`` and read the answer. ``timeout``: seconds for this call and the ones
        after it, ``None`` to wait without limit; left out, the connection's timeout holds."""
        if timeout is not _KEEP:
            self.sock.settimeout(timeout)  # type: ignore[arg-type]
        self.sock.sendall(json.dumps(req).encode("utf-8") + b"\n")
        line = self._file.readline()
        if not line:
            raise ConnectionError("the agent closed the control connection")
        reply = json.loads(line)
        if not isinstance(reply, dict):
            raise ConnectionError("the agent answered something that is not a JSON object")
        return reply

    def close(self) -> None:
        self._file.close()
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def request(state_dir: Path, req: dict[str, Any], timeout: float | None = 30.0) -> dict[str, Any]:
    """One request on a fresh connection. Raises AgentNotRunning, OSError."""
    with Client(state_dir, timeout) as c:
        return c.call(req)
