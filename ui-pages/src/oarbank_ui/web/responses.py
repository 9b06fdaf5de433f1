"""What the portal answers, whichever server carries it: a ``Response`` (status, body, type,
headers), the JSON forms of an answer and of a refusal, and ``Admission`` (a heartbeat whose
headers passed). Its own module so the app, the heartbeat path and the ASGI servers share one
definition without importing each other."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Admission", "Response", "error_response", "json_response"]


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def json_response(status: int, doc: Any, **kw: Any) -> Response:
    return Response(status, (json.dumps(doc) + "\n").encode(), "application/json", **kw)


def error_response(status: int, message: str, **kw: Any) -> Response:
    """The portal's refusal body: ``{"error": message}``."""
    return json_response(status, {"error": message}, **kw)


@dataclass(frozen=True)
class Admission:
    """A request's headers passed: for a heartbeat, the node its token names; for another
    request, its headers (lower-case names) for the route to read."""

    node_id: str
    headers: Mapping[str, str] = field(default_factory=dict)
