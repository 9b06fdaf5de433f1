"""``POST /v1/heartbeat`` as a bare ASGI callable, in front of the Starlette app (asgi.py).

A report is the one request a fleet sends a thousand times a second, so its path through the
server is kept short: no Starlette ``Request`` or ``Response`` objects, no router, the few
headers it needs read once, the answer sent as two ASGI messages with headers encoded here,
and the body's deadline a plain timer on the running task rather than ``asyncio.timeout``'s
machinery or ``wait_for``'s task of its own. What it answers is what asgi.py answered for a
report: the same checks in the same order (Host, content type, a token at all, the declared
length, the body within the read timeout, not cut short), the same refusals and metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .app import MAX_BODY, Portal
from .responses import Response as PortalResponse
from .responses import error_response

__all__ = ["build_heartbeat_app", "is_heartbeat_post", "read_body", "Truncated"]

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_PATHS = (b"/v1/heartbeat", b"/v1/heartbeat/")


class Truncated(Exception):
    """A request's body ended before its Content-Length, or ran past it (the message says)."""


def is_heartbeat_post(scope: dict[str, Any]) -> bool:
    """Whether ``scope`` is a report, judged on the path as sent (as asgi.py judged it)."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    raw = scope.get("raw_path")
    if raw is None:
        raw = scope["path"].encode("latin-1", "replace")
    return raw in _PATHS or raw.rstrip(b"/") == b"/v1/heartbeat"


async def read_body(receive: Receive, length: int) -> bytes:
    message = await receive()
    if message["type"] == "http.disconnect":
        raise Truncated(f"the client went away after 0 of {length} bytes")
    body = message.get("body", b"")
    if not message.get("more_body", False):  # the usual case: the whole body in one message
        if len(body) != length:
            raise Truncated(f"{len(body)} of the declared {length} bytes" if len(body) < length
                             else f"more than the declared {length} bytes")
        return body
    chunks = [body]
    got = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Truncated(f"the client went away after {got} of {length} bytes")
        chunk = message.get("body", b"")
        got += len(chunk)
        if got > length:  # the server enforces Content-Length; this is the belt to its braces
            raise Truncated(f"more than the declared {length} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if got != length:
        raise Truncated(f"{got} of the declared {length} bytes")
    return b"".join(chunks)


async def _within(coro: Awaitable[bytes], seconds: float) -> bytes:
    """``coro``'s result, or TimeoutError after ``seconds``: a timer that cancels this task
    (a third of ``asyncio.timeout``'s cost, and no task of its own as ``wait_for`` makes)."""
    task = asyncio.current_task()
    assert task is not None
    expired: list[bool] = []

    def expire() -> None:
        expired.append(True)
        task.cancel()

    timer = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        return await coro
    except asyncio.CancelledError:
        if not expired:
            raise  # cancelled from outside (the server stopping): not ours to swallow
        if hasattr(task, "uncancel"):  # 3.11+: this cancel is handled here
            task.uncancel()
        raise TimeoutError from None
    finally:
        timer.cancel()


def build_heartbeat_app(portal: Portal, *, read_timeout_s: float = 10.0) -> Callable[
        [dict[str, Any], Receive, Send], Awaitable[None]]:
    """The ASGI callable for reports (``is_heartbeat_post`` scopes only)."""

    async def answer(scope: dict[str, Any], receive: Receive) -> tuple[PortalResponse | None,
                                                                          bool]:
        """The answer and whether the connection must close after it (None: nobody to
        answer, the body was cut short)."""
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            name = k.decode("latin-1").lower()
            value = v.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        path = scope.get("raw_path", b"").decode("latin-1") or scope["path"]
        early = portal.admit("POST", path, headers, lookup=False)
        if isinstance(early, PortalResponse):
            return early, True  # the body was not read: the connection cannot carry another
        length = headers.get("content-length", "")
        if not length.isdigit():
            return error_response(411, "Content-Length is required"), True
        n = int(length)
        if n > MAX_BODY:
            return portal.refuse("too_large", 413, f"heartbeat: body of {n} bytes is larger "
                                 "than 1 MiB"), True
        try:
            body = await _within(read_body(receive, n), read_timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            return portal.refuse("read_timeout", 408, "heartbeat: body not received within "
                                 f"{read_timeout_s:g} s"), True
        except Truncated as e:
            # Nobody is left to read an answer; the refusal is counted and logged.
            portal.refuse("truncated", 400, f"heartbeat: body cut short, not parsed ({e})")
            return None, True
        # group commit: parsed here, stored with others, answered after the commit
        return await portal.ingest.post(headers, body), False

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        try:
            r, close = await answer(scope, receive)
        finally:  # every report, refused ones too, from its head to its answer
            portal.metrics.observe("heartbeat", started)
        if r is None:
            body, head = b"", [(b"content-length", b"0"), (b"connection", b"close")]
            status = 400
        else:
            body, status = r.body, r.status
            head = [(b"content-type", r.content_type.encode("latin-1")),
                    (b"content-length", str(len(body)).encode("latin-1"))]
            for k, v in r.headers.items():
                head.append((k.lower().encode("latin-1"), v.encode("latin-1")))
            if close:
                head.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body})

    return app
