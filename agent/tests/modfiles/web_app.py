"""The FastAPI app of agent/tests/test_web_agent.py's battery module (it replaces app.py in a
copy of examples/openai-compatible, whose model_service.py serves it with serve_asgi).

GET /info (pid), POST /digest (length and sha256 of the body, read as a stream),
GET /stream?n=&gap= (server-sent events), GET /boom (raises), POST /die (answers, then the
process exits 0.2 s later: the agent sees the service fail and restarts it)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse

app = FastAPI()


@app.get("/info")
async def info() -> dict:
    return {"pid": os.getpid()}


@app.post("/digest")
async def digest(request: Request) -> dict:
    h, n = hashlib.sha256(), 0
    async for chunk in request.stream():
        h.update(chunk)
        n += len(chunk)
    return {"length": n, "sha256": h.hexdigest()}


@app.get("/stream")
async def stream(n: int = 3, gap: float = 0.0) -> StreamingResponse:
    async def events():
        for i in range(n):
            yield f"data: {json.dumps({'i': i})}\n\n"
            if gap:
                await asyncio.sleep(gap)
        yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")


@app.get("/boom")
async def boom() -> dict:
    raise RuntimeError("the app raised (GET /boom)")


@app.post("/die")
async def die() -> dict:
    asyncio.get_running_loop().call_later(0.2, os._exit, 1)
    return {"dying": os.getpid()}
