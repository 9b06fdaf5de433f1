"""What every component family shares: the render context, placeholders, the ``requires``
gate and a component's source (its rows, shaped by ``group_by``/``agg``/``order_by``/
``limit``/``fields`` the same way wherever the rows come from)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from oarbank_sdk.page_forms import Target

from ...queries.shape import ShapeError, Shaping, read_shaping, shape_rows

__all__ = ["HOST_CONTRACT", "MAX_PER_CONTAINER", "NEEDS_CONTRACT", "NOT_SUPPORTED", "UNAVAILABLE",
           "WRONG", "RenderContext", "SourceFailed", "placeholder", "requires_gate", "rows_of",
           "string_prop"]

HOST_CONTRACT = (1, 2)
MAX_PER_CONTAINER = 40
NOT_SUPPORTED = "not supported by this console version"
NEEDS_CONTRACT = "needs UI contract {}"
UNAVAILABLE = "data unavailable"
WRONG = "—"
VERSION = re.compile(r"^(\d+)\.(\d+)$")

Fetch = Callable[[str, dict[str, Any]], list[dict[str, Any]]]
# A typed link target -> its href on this portal, or None when the portal has no page for it.
Resolve = Callable[[Target], "str | None"]


@dataclass
class RenderContext:
    """What a render needs from outside: a way to run a query, the node shown, the clock.

    ``fetch(query, params)`` returns rows (any exception: "data unavailable"); when it also
    has ``fetch.shaped(query, params, shaping)`` the store shapes the rows itself (in SQL)
    and the renderer does not shape them again. ``args`` are the request's query arguments
    (table paging and sorting; None: a static preview, where no link can carry them).
    ``subject`` is what ``when`` reads besides the fixed parts (``node.*``)."""

    fetch: Fetch
    node: str | None = None  # the node a panel shows: the value of "$node"
    now: float = 0.0
    resolve: Resolve | None = None  # typed link targets; None: only https urls are links
    args: dict[str, str] | None = None
    subject: dict[str, Any] = field(default_factory=dict)
    _next: int = field(default=0, repr=False)

    def next_cid(self) -> str:
        self._next += 1
        return f"c{self._next}"


class SourceFailed(Exception):
    """A component's source gave no rows; the message says why (shown on hover)."""


def placeholder(text: str, detail: str = "", why: str = "") -> dict[str, Any]:
    """``why`` is shown beside ``text``; ``detail`` only on hover."""
    return {"kind": "placeholder", "text": text, "detail": detail, "why": why, "id": None}


def malformed(ctype: str, what: str) -> dict[str, Any]:
    """A known component whose props are wrong: the placeholder names the prop and why."""
    return placeholder(NOT_SUPPORTED, f"{ctype}: {what}", f"{ctype}: {what}")


def string_prop(comp: dict[str, Any], key: str, default: str = "") -> str:
    v = comp.get(key)
    return v if isinstance(v, str) else default


def requires_gate(comp: dict[str, Any]) -> str | None:
    """The placeholder text when the component needs a newer contract, else None."""
    req = comp.get("requires")
    if req is None:
        return None
    m = VERSION.match(req) if isinstance(req, str) else None
    if not m:
        return NOT_SUPPORTED
    version = (int(m.group(1)), int(m.group(2)))
    if version[0] != HOST_CONTRACT[0] or version > HOST_CONTRACT:
        return NEEDS_CONTRACT.format(req)
    return None


def _params(raw: Any, ctx: RenderContext) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SourceFailed("params must be an object")
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if v == "$node":
            if ctx.node is None:
                raise SourceFailed("$node used where no node is shown")
            v = ctx.node
        out[k] = v
    return out


def source_shaping(source: Any) -> Shaping:
    try:
        return read_shaping(source)
    except ShapeError as e:
        raise SourceFailed(str(e)) from e


def rows_of(source: Any, ctx: RenderContext) -> list[dict[str, Any]]:
    """Run a component's source; SourceFailed (with a reason) for anything that goes wrong."""
    if not isinstance(source, dict) or not isinstance(source.get("query"), str):
        raise SourceFailed("the source has no query")
    params = _params(source.get("params"), ctx)
    shaping = source_shaping(source)
    shaped = getattr(ctx.fetch, "shaped", None)
    try:
        if callable(shaped):
            rows = shaped(source["query"], params, shaping)
        else:
            rows = ctx.fetch(source["query"], params)
    except Exception as e:  # any failure of the source is shown, never raised into the page
        raise SourceFailed(str(e) or type(e).__name__) from e
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise SourceFailed("the query did not return a list of rows")
    if not callable(shaped):
        try:
            rows = shape_rows(rows, shaping)
        except ShapeError as e:
            raise SourceFailed(str(e)) from e
    return rows
