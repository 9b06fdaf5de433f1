"""The servers and clients people already use, behind the agent (``pip install
oarbank-sdk[web]``: uvicorn, httpx, requests). Nothing listens; every connection is one the
agent hands over.

Service side (the daemon ``start`` leaves running)::

    from oarbank_sdk.web import serve_asgi
    serve_asgi(app)        # FastAPI/Starlette app: lifespan startup, ready, serve, shutdown

Job side (the URL's host names the service)::

    from oarbank_sdk import web
    httpx.Client(transport=web.HTTPTransport("model"), base_url="http://model")
    httpx.AsyncClient(transport=web.AsyncHTTPTransport("model"), base_url="http://model")
    web.session("model").post("http://model/v1/generate", json={...})
    openai.OpenAI(base_url="http://model/v1", api_key="-",
                  http_client=httpx.Client(transport=web.HTTPTransport("model")))

Each name is imported on first use, so a service needs neither httpx nor requests, and a job
needs no uvicorn. ``oarbank_sdk.service_endpoint`` stays standard library only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oarbank_sdk.web.asgi import StartupFailed, serve_asgi
    from oarbank_sdk.web.sessions import EndpointAdapter, session
    from oarbank_sdk.web.transports import AsyncHTTPTransport, HTTPTransport

__all__ = ["serve_asgi", "StartupFailed", "HTTPTransport", "AsyncHTTPTransport", "session",
           "EndpointAdapter"]

_WHERE = {
    "serve_asgi": ("asgi", "uvicorn"),
    "StartupFailed": ("asgi", "uvicorn"),
    "HTTPTransport": ("transports", "httpx"),
    "AsyncHTTPTransport": ("transports", "httpx"),
    "session": ("sessions", "requests"),
    "EndpointAdapter": ("sessions", "requests"),
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'oarbank_sdk.web' has no attribute {name!r}")
    module, needs = where
    try:
        mod = importlib.import_module(f"oarbank_sdk.web.{module}")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("uvicorn", "httpx", "httpcore", "anyio",
                                                     "requests", "urllib3"):
            raise ImportError(f"oarbank_sdk.web.{name} needs {needs} ({exc.name} is missing): "
                              f"pip install 'oarbank-sdk[web]'") from exc
        raise
    value = getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
