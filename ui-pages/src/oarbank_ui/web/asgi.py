"""The portal's one ASGI front end, for uvicorn (server.py): every request enters here.

What this layer adds to the request logic (app.py), and why; each check is written once:
- The checks that need neither the body nor the store (``Portal.admit(lookup=False)``: Host;
  for a report its content type and that it carries a token at all) run on the event loop
  first: a caller without a token is answered before a byte of its body is read.
- A body must declare its length (411 otherwise) and be at most 1 MiB (413, from the declared
  length, before reading); it must arrive within ``read_timeout_s`` (408 otherwise) so a
  stalled client holds a connection slot for seconds, not forever (``_body``).
- A body cut short by a disconnect is dropped, never parsed: ``{`` from a client that went
  away is not a heartbeat. Nobody is left to read an answer.
- A report's refusals are counted by cause and logged (``Portal.refuse``); another request's
  are plain answers.
- A report (``POST /v1/heartbeat``) and a claim (``POST /v1/agent/claim``), the requests a
  fleet sends a thousand times a second, take a short path (``_short_path``): no Starlette
  ``Request``, ``Response`` or router, the answer sent as two ASGI messages with headers
  encoded here (``_send``); past its headers a report is ``reports.py``'s (token, parsing,
  group commit), a claim ``dispatch/http.py``'s (its own group commit; a held claim watches
  for its client's disconnect, ``Disconnect``, and grants nothing after it: a grant nobody
  reads would wait out its lease). Every other request goes through Starlette to
  ``Portal.handle`` in the thread pool (the store is blocking: sqlite3, psycopg's pool).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .app import MAX_BODY, Portal, reply_response, route_name
from .responses import Response as PortalResponse
from .responses import error_response

__all__ = ["Truncated", "build_app", "is_claim_post", "is_heartbeat_post", "read_body"]

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Receive, Send], Awaitable[None]]

_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


class Truncated(Exception):
    """A request's body ended before its Content-Length, or ran past it (the message says)."""


def _is_post_to(scope: dict[str, Any], path: bytes) -> bool:
    """Whether ``scope`` POSTs to ``path`` (trailing slashes aside), judged as sent."""
    if scope["type"] != "http" or scope["method"] != "POST":
        return False
    raw = scope.get("raw_path")
    if raw is None:
        raw = scope["path"].encode("latin-1", "replace")
    return raw == path or raw.rstrip(b"/") == path


def is_heartbeat_post(scope: dict[str, Any]) -> bool:
    """Whether ``scope`` is a report."""
    return _is_post_to(scope, b"/v1/heartbeat")


def is_claim_post(scope: dict[str, Any]) -> bool:
    """Whether ``scope`` is a node's claim (contract 10.4)."""
    return _is_post_to(scope, b"/v1/agent/claim")


def _headers(scope: Mapping[str, Any]) -> dict[str, str]:
    """The request's headers, names lower-case, repeated ones joined as HTTP joins them."""
    headers: dict[str, str] = {}
    for k, v in scope["headers"]:
        name = k.decode("latin-1").lower()
        value = v.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _path(scope: Mapping[str, Any]) -> str:
    # raw_path: the path as sent (Portal.handle decodes each segment itself, so a node id
    # with an encoded "/" stays one segment).
    return scope.get("raw_path", scope["path"].encode()).decode("latin-1")


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


class Disconnect:
    """Whether a long poll's client went away (``http.disconnect``): the request's
    ``receive`` is watched from the first ask on, so a claim that returns at once costs no
    task. Called as ``gone()``."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._watch: asyncio.Task[None] | None = None
        self._gone = False

    def __call__(self) -> bool:
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._wait())
        return self._gone

    async def _wait(self) -> None:
        # uvicorn's receive() blocks, once the body is read, until the client goes; a server
        # that answered at once would only slow this loop, never spin it
        while (await self._receive())["type"] != "http.disconnect":
            await asyncio.sleep(0.1)
        self._gone = True

    def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()


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


async def _body(portal: Portal, receive: Receive, headers: dict[str, str],
                read_timeout_s: float, *, report: bool,
                limit: int = MAX_BODY) -> bytes | PortalResponse | None:
    """The body its headers declare, or the answer refusing it (None: it was cut short and
    nobody is left to answer). ``report``: a refusal is a report's (counted, logged)."""
    what = "heartbeat: body" if report else "body"

    def refuse(cause: str, status: int, message: str) -> PortalResponse:
        return portal.refuse(cause, status, message) if report else error_response(status,
                                                                                   message)

    length = headers.get("content-length", "")
    if not length.isdigit():
        return error_response(411, "Content-Length is required")
    n = int(length)
    if n > limit:
        return refuse("too_large", 413, f"{what} of {n} bytes is larger than "
                                        f"{limit >> 20} MiB")
    try:
        return await _within(read_body(receive, n), read_timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        return refuse("read_timeout", 408, f"{what} not received within {read_timeout_s:g} s")
    except Truncated as e:
        refuse("truncated", 400, f"{what} cut short, not parsed ({e})")
        return None


def _short_path(portal: Portal, read_timeout_s: float,
                handle: Callable[[dict[str, str], bytes, Receive], Awaitable[PortalResponse]],
                *, report: bool) -> ASGIApp:
    """The ASGI callable of a POST that skips Starlette (a report, a claim): the checks every
    request gets, its body read within its bounds, ``handle(headers, body, receive)``'s
    answer sent in one go, its time observed under its route (refused ones too). ``report``:
    a refusal is a report's (counted, logged)."""

    async def answer(scope: dict[str, Any], receive: Receive) -> tuple[PortalResponse | None,
                                                                          bool]:
        """The answer and whether the connection must close after it (None: nobody to
        answer, the body was cut short)."""
        path, headers = _path(scope), _headers(scope)
        early = portal.admit("POST", path, headers, lookup=False)
        if isinstance(early, PortalResponse):
            return early, True  # the body was not read: the connection cannot carry another
        body = await _body(portal, receive, headers, read_timeout_s, report=report,
                           limit=portal.body_limit(path))
        if not isinstance(body, bytes):
            return body, True
        return await handle(headers, body, receive), False

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        try:
            r, close = await answer(scope, receive)
        finally:  # every request, refused ones too, from its head to its answer
            portal.metrics.observe(route_name(scope["path"]), started)
        await _send(send, r, close)

    return app


async def _send(send: Send, r: PortalResponse | None, close: bool) -> None:
    """An answer as two ASGI messages (None: a body cut short, nobody to answer: 400, closed)."""
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


def _to_starlette(r: PortalResponse, *, close: bool = False) -> Response:
    headers = dict(r.headers)
    if close:
        # The body was not read: the connection cannot carry another request.
        headers["Connection"] = "close"
    return Response(r.body, status_code=r.status, headers=headers, media_type=r.content_type)


def build_app(portal: Portal, *, read_timeout_s: float = 10.0) -> ASGIApp:
    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        try:
            return await answer(request)
        finally:  # every request, refused ones too, from its head to its answer
            portal.metrics.observe(route_name(request.scope["path"]), started)

    async def answer(request: Request) -> Response:
        scope = request.scope
        method, path, headers = scope["method"], _path(scope), _headers(scope)
        early = portal.admit(method, path, headers, lookup=False)
        if isinstance(early, PortalResponse):
            return _to_starlette(early, close=method == "POST")
        body = b""
        if method in ("POST", "PUT", "PATCH"):
            got = await _body(portal, request.receive, headers, read_timeout_s, report=False,
                              limit=portal.body_limit(path))
            if got is None:  # nobody is left to read an answer
                return Response(b"", status_code=400, headers={"Connection": "close"})
            if isinstance(got, PortalResponse):
                return _to_starlette(got, close=True)
            body = got
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"),
                         keep_blank_values=True)
        r = await run_in_threadpool(portal.handle, method, path, query, body, headers, None,
                                    False)
        return _to_starlette(r)

    routed = Starlette(routes=[Route("/{path:path}", endpoint, methods=_METHODS)])
    async def report_answer(headers: dict[str, str], body: bytes,
                            _receive: Receive) -> PortalResponse:
        # group commit: parsed here, stored with others, answered after the commit
        return await portal.ingest.post(headers, body)

    async def claim_answer(headers: dict[str, str], body: bytes,
                           receive: Receive) -> PortalResponse:
        # a long poll that waits on the event loop, its store work in the claims' group
        # commit (dispatch/http.py); it grants nothing once its node has gone
        gone = Disconnect(receive)
        try:
            return reply_response(await portal.dispatch.claim(body, headers, run_in_threadpool,
                                                              gone))
        finally:
            gone.close()

    report = _short_path(portal, read_timeout_s, report_answer, report=True)
    claim = _short_path(portal, read_timeout_s, claim_answer, report=False)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if is_heartbeat_post(scope):
            await report(scope, receive, send)
        elif is_claim_post(scope):
            await claim(scope, receive, send)
        else:
            await routed(scope, receive, send)

    return app
