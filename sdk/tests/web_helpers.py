"""The service of the oarbank_sdk.web tests: a FastAPI app served by ``serve_asgi`` on the
connections the test's agent (``endpoint_helpers.FakeAgent``, or the real agent) hands over.

    python web_helpers.py start   # the `start` op: leaves `serve` running with the channel
    python web_helpers.py serve   # the daemon: serve_asgi(app)

``WEB_HELPER_MARKS`` (a folder): the app writes ``startup`` (its pid) once its lifespan
startup is done, ``ready`` when serve_asgi calls ``on_ready``, and ``shutdown`` (its pid) when
the lifespan shutdown runs. ``WEB_HELPER_LOAD_S``: how long the startup "loads" (default 0).
``WEB_HELPER_FAIL_STARTUP=1``: the startup raises.

Routes: ``GET /info`` (pid, the ASGI client, the Host header, how many requests this
connection carried), ``POST /digest`` (the body's length and sha256, read as a stream),
``GET /stream?n=&gap=`` (server-sent events, one every ``gap`` seconds), ``GET /boom`` (the
app raises), ``GET /slow?s=`` (answers after ``s`` seconds; counts the ones that finished or
were cancelled in ``/info``), ``POST /v1/chat/completions`` (an OpenAI-style answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

MARKS = os.environ.get("WEB_HELPER_MARKS")
COUNTS = {"slow_done": 0, "slow_cancelled": 0, "requests": 0}


def _mark(name: str) -> None:
    if MARKS:
        Path(MARKS, name).write_text(f"{os.getpid()}\n")


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    await asyncio.sleep(float(os.environ.get("WEB_HELPER_LOAD_S", "0")))
    if os.environ.get("WEB_HELPER_FAIL_STARTUP") == "1":
        raise RuntimeError("the model did not load (WEB_HELPER_FAIL_STARTUP)")
    _mark("startup")
    yield {"loaded_at": time.time()}
    _mark("shutdown")


app = FastAPI(lifespan=lifespan)


@app.get("/info")
async def info(request: Request) -> dict:
    COUNTS["requests"] += 1
    return {"pid": os.getpid(), "client": list(request.client or ()),
            "host": request.headers.get("host"), "loaded_at": request.state.loaded_at,
            **COUNTS}


@app.post("/digest")
async def digest(request: Request) -> dict:
    h = hashlib.sha256()
    n = 0
    async for chunk in request.stream():
        h.update(chunk)
        n += len(chunk)
    return {"length": n, "sha256": h.hexdigest()}


@app.get("/stream")
async def stream(n: int = 5, gap: float = 0.0) -> StreamingResponse:
    async def events():
        for i in range(n):
            yield f"data: {json.dumps({'i': i, 't': time.time()})}\n\n"
            if gap:
                await asyncio.sleep(gap)
        yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")


@app.get("/boom")
async def boom() -> dict:
    raise RuntimeError("the app raised (GET /boom)")


@app.get("/slow")
async def slow(s: float = 1.0) -> dict:
    try:
        await asyncio.sleep(s)
    except asyncio.CancelledError:
        COUNTS["slow_cancelled"] += 1
        raise
    COUNTS["slow_done"] += 1
    return {"slept": s}


@app.post("/v1/chat/completions")
async def chat(request: Request) -> JSONResponse:
    body = await request.json()
    text = " ".join(m["content"] for m in body["messages"])[::-1]
    return JSONResponse({
        "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()),
        "model": body["model"],
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


def _main(argv: list[str]) -> int:
    from oarbank_sdk import service_endpoint as ep

    if argv[1] == "start":
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve"],
                                **ep.inherit_channel())
        print(json.dumps({"ok": True, "daemon_pid": proc.pid}), flush=True)
        return 0
    if argv[1] == "serve":
        from oarbank_sdk.web import serve_asgi

        http = os.environ.get("WEB_HELPER_HTTP", "auto")
        serve_asgi(app, on_ready=lambda: _mark("ready"), http=http, log_level="warning",
                   timeout_graceful_shutdown=float(os.environ.get("WEB_HELPER_GRACE_S", "5")))
        print(json.dumps({"served": "eof"}), flush=True)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
