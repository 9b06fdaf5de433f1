"""An OpenAI-compatible model server: a FastAPI app, exactly as one is written to run under
uvicorn on a port. Nothing in this file knows about the agent; model_service.py serves it on
the connections the agent hands over (``serve_asgi(app)``), which is the one change.

Routes (the OpenAI API's shapes, the fields a client reads):

    GET  /v1/models                the one model
    POST /v1/chat/completions      {"model", "messages": [{"role", "content"}], "stream"?, "max_tokens"?}
    POST /v1/completions           {"model", "prompt": str, "stream"?, "max_tokens"?}

``"stream": true`` answers server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``),
one token at a time. A body that is not what the route takes is 422 (FastAPI's validation);
an unknown path 404.

The model is a stand-in: it loads once, slowly (``load_s``), in the app's lifespan startup,
and answers the prompt reversed plus a hash tag (deterministic, so goldens can pin it),
a word per token, ``token_s`` apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

MODEL_ID = "stand-in-reverser"


class StandInModel:
    """What a real server loads from weights. ``loads``: how many times this process loaded it."""

    loads = 0

    def __init__(self, load_s: float, token_s: float) -> None:
        self.load_s = load_s
        self.token_s = token_s

    async def load(self) -> None:
        await asyncio.sleep(self.load_s)  # a real server reads its weights here
        StandInModel.loads += 1

    @staticmethod
    def complete(prompt: str) -> str:
        tag = hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:8]
        return f"{prompt[::-1]} [{tag}]"

    async def tokens(self, prompt: str, max_tokens: int | None) -> AsyncIterator[str]:
        words = self.complete(prompt).split(" ")
        for i, word in enumerate(words[:max_tokens] if max_tokens else words):
            if i and self.token_s:
                await asyncio.sleep(self.token_s)
            yield word if i == 0 else " " + word


def _settings() -> dict:
    """``load_s`` and ``token_s`` from the JSON file in OARBANK_SETTINGS_FILE, if any."""
    conf = {"load_s": 2.0, "token_s": 0.02}
    name = os.environ.get("OARBANK_SETTINGS_FILE")
    if name and os.path.exists(name):
        with open(name, encoding="utf-8") as f:
            raw = json.load(f)
        conf.update({k: float(raw[k]) for k in conf if k in raw})
    return conf


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    conf = _settings()
    model = StandInModel(conf["load_s"], conf["token_s"])
    await model.load()  # once per process, before the server takes a request
    app.state.model = model
    yield


app = FastAPI(title="openai-compatible stand-in", lifespan=lifespan)


class Message(BaseModel):
    role: str
    content: str


class ChatRequest(BaseModel):
    model: str
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1)


class CompletionRequest(BaseModel):
    model: str
    prompt: str
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1)


def _fingerprint() -> str:
    """Which server process answered, and how many times it loaded the model."""
    return f"pid-{os.getpid()}-loads-{StandInModel.loads}"


def _usage(prompt: str, text: str) -> dict:
    p, c = len(prompt.split()), len(text.split())
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def _sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def events() -> AsyncIterator[str]:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n"
        yield "data: [DONE]\n\n"
    return StreamingResponse(events(), media_type="text/event-stream")


@app.get("/v1/models")
async def models() -> dict:
    return {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "created": 0,
                                        "owned_by": "oarbank"}]}


@app.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatRequest, request: Request) -> dict | StreamingResponse:
    model: StandInModel = request.app.state.model
    prompt = body.messages[-1].content
    cid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
    if body.stream:
        async def chunks() -> AsyncIterator[dict]:
            first = True
            async for token in model.tokens(prompt, body.max_tokens):
                delta = {"role": "assistant", "content": token} if first else {"content": token}
                first = False
                yield {"id": cid, "object": "chat.completion.chunk", "created": created,
                       "model": body.model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            yield {"id": cid, "object": "chat.completion.chunk", "created": created,
                   "model": body.model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        return _sse(chunks())
    text = "".join([t async for t in model.tokens(prompt, body.max_tokens)])
    return {"id": cid, "object": "chat.completion", "created": created, "model": body.model,
            "system_fingerprint": _fingerprint(),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": _usage(prompt, text)}


@app.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> dict | StreamingResponse:
    model: StandInModel = request.app.state.model
    cid, created = f"cmpl-{uuid.uuid4().hex[:12]}", int(time.time())
    if body.stream:
        async def chunks() -> AsyncIterator[dict]:
            async for token in model.tokens(body.prompt, body.max_tokens):
                yield {"id": cid, "object": "text_completion", "created": created,
                       "model": body.model,
                       "choices": [{"index": 0, "text": token, "finish_reason": None,
                                    "logprobs": None}]}
            yield {"id": cid, "object": "text_completion", "created": created, "model": body.model,
                   "choices": [{"index": 0, "text": "", "finish_reason": "stop", "logprobs": None}]}
        return _sse(chunks())
    text = "".join([t async for t in model.tokens(body.prompt, body.max_tokens)])
    return {"id": cid, "object": "text_completion", "created": created, "model": body.model,
            "system_fingerprint": _fingerprint(),
            "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
            "usage": _usage(body.prompt, text)}


if __name__ == "__main__":  # how it ran before the agent: on a port
    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=8000)
