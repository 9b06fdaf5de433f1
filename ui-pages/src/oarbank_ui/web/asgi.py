"""``Portal.handle`` as an ASGI app (Starlette), for uvicorn (server.py).

What this layer adds to the request logic, and why:
- The checks that need neither the body nor the store (Host; for a heartbeat its content type
  and that it carries a token at all) run on the event loop first: a caller without a token
  is answered before a byte of its body is read. The token itself is looked up with the rest
  of the request, in one trip to the thread pool (a hop costs about as much as the lookup).
- A body must declare its length (411 otherwise) and be at most 1 MiB (413, from the declared
  length, before reading); it must arrive within ``read_timeout_s`` (408 otherwise) so a
  stalled client holds a connection slot for seconds, not forever.
- A body cut short by a disconnect is dropped, never parsed: ``{`` from a client that went
  away is not a heartbeat.
- The store is blocking (sqlite3, psycopg's pool): requests run in Starlette's thread pool,
  the event loop only moves bytes.
- A report (``POST /v1/heartbeat``) does not enter Starlette at all: heartbeat.py answers
  it with the same checks, on a shorter path.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .app import MAX_BODY, Portal, route_name
from .heartbeat import Truncated, build_heartbeat_app, is_heartbeat_post, read_body
from .responses import Response as PortalResponse
from .responses import error_response

__all__ = ["build_app"]

_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


def _to_starlette(r: PortalResponse, *, close: bool = False) -> Response:
    headers = dict(r.headers)
    if close:
        # The body was not read: the connection cannot carry another request.
        headers["Connection"] = "close"
    return Response(r.body, status_code=r.status, headers=headers, media_type=r.content_type)


def build_app(portal: Portal, *, read_timeout_s: float = 10.0) -> Any:
    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        try:
            return await answer(request)
        finally:  # every request, refused ones too, from its head to its answer
            portal.metrics.observe(route_name(request.scope["path"]), started)

    async def answer(request: Request) -> Response:
        scope = request.scope
        method = scope["method"]
        # raw_path: the path as sent (Portal.handle decodes each segment itself, so a node id
        # with an encoded "/" stays one segment).
        path = scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            name = k.decode("latin-1").lower()
            value = v.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"),
                         keep_blank_values=True)
        is_heartbeat = path.rstrip("/") == "/v1/heartbeat"
        early = portal.admit(method, path, headers, lookup=False)
        if isinstance(early, PortalResponse):
            return _to_starlette(early, close=method == "POST")
        body = b""
        if method in ("POST", "PUT", "PATCH"):
            length = headers.get("content-length", "")
            if not length.isdigit():
                return _to_starlette(error_response(411, "Content-Length is required"), close=True)
            n = int(length)
            if n > MAX_BODY:
                r = error_response(413, "body larger than 1 MiB")
                if is_heartbeat:
                    r = portal.refuse("too_large", 413, f"heartbeat: body of {n} bytes is "
                                      "larger than 1 MiB")
                return _to_starlette(r, close=True)
            try:
                # wait_for, not asyncio.timeout: the package runs on Python 3.10 too
                body = await asyncio.wait_for(read_body(request.receive, n), read_timeout_s)
            except asyncio.TimeoutError:
                r = portal.refuse("read_timeout", 408, f"heartbeat: body not received within "
                                  f"{read_timeout_s:g} s")
                return _to_starlette(r, close=True)
            except Truncated as e:
                # Nobody is left to read an answer; the refusal is counted and logged.
                portal.refuse("truncated", 400, f"heartbeat: body cut short, not parsed ({e})")
                return Response(b"", status_code=400, headers={"Connection": "close"})
        if is_heartbeat and method == "POST":
            # group commit: parsed here, stored with others, answered after the commit
            return _to_starlette(await portal.ingest.post(headers, body))
        r = await run_in_threadpool(portal.handle, method, path, query, body, headers, None,
                                    False)
        return _to_starlette(r)

    routed = Starlette(routes=[Route("/{path:path}", endpoint, methods=_METHODS)])
    # a report skips Starlette altogether (heartbeat.py: the same checks and answers)
    heartbeat = build_heartbeat_app(portal, read_timeout_s=read_timeout_s)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if is_heartbeat_post(scope):
            await heartbeat(scope, receive, send)
            return
        await routed(scope, receive, send)

    return app
