"""UI contract 1.2 renderer, decision half (contract section 7).

``build_view(page, ctx)`` turns a page or panel document into a *view*: plain dicts that say
exactly what to show (texts already formatted, tones chosen, placeholders decided). The HTML
templates (``templates/``, Jinja2 with autoescaping) and the page's refresh script both draw
that view, so every rule lives here once and is tested without a browser.

Rules (a renderer never breaks on what it does not know):
- a component whose ``requires`` is newer than ``HOST_CONTRACT`` -> placeholder
  "needs UI contract 1.N" (or nothing with ``fallback = "drop"``);
- an unknown component type -> placeholder "not supported by this console version" (or nothing);
- a source that fails (unknown query, bad params, ``$node`` on a page without a node, the store
  failing) -> "data unavailable", the rest of the page renders;
- a value of the wrong type for its column -> "—"; a null value -> empty;
- at most 40 components per container; the rest are not rendered and a notice says how many;
- ``link.to`` and ``kv`` items are read in both forms (``oarbank_sdk.page_forms``, the
  checker's reader): a typed link target the portal cannot resolve (``RenderContext.resolve``
  says where a target goes, or None) renders as plain text, never as a broken link;
- what upstream's console serves and this portal does not is a placeholder that says why
  (``page_forms``, the checker's words): a component whose source is a module view or an
  upstream host query this portal does not answer -> "served by upstream's coordinator, not
  by this portal" naming the source; a component type upstream's console draws -> "not
  supported by this console version" with the reason; ``columns`` lays its children out one
  after another.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from oarbank_sdk.page_forms import (
    HOST_QUERIES,
    NOT_SERVED,
    UPSTREAM_COMPONENTS,
    KvItem,
    Target,
    kv_item,
    link_target,
    not_served,
)

__all__ = [
    "HOST_CONTRACT",
    "MAX_PER_CONTAINER",
    "NEEDS_CONTRACT",
    "NOT_SERVED",
    "NOT_SUPPORTED",
    "UNAVAILABLE",
    "WRONG",
    "RenderContext",
    "ago_text",
    "build_view",
    "data_views",
    "format_cell",
    "iso_text",
]

HOST_CONTRACT = (1, 2)
MAX_PER_CONTAINER = 40
NOT_SUPPORTED = "not supported by this console version"
NEEDS_CONTRACT = "needs UI contract {}"
UNAVAILABLE = "data unavailable"
WRONG = "—"
TONES = ("ok", "warn", "error", "info", "neutral", "running")
# Column types this console formats; other ("and more") types are shown as text.
COLUMN_TYPES = ("text", "integer", "number", "status", "code", "relative_time", "timestamp",
                "bool")
# Tones for well-known values when a status column or component gives none.
DEFAULT_TONES = {
    "ready": "ok", "healthy": "ok", "ok": "ok", "true": "ok",
    "starting": "running", "running": "running",
    "stopped": "neutral", "idle": "neutral",
    "unhealthy": "error", "error": "error", "failed": "error", "withdrawn": "error",
    "held": "warn", "disabled": "warn", "false": "neutral",
    # "unknown" is what a stale node's rows answer (contract 6.3): a warning, not news.
    "undetected": "info", "unknown": "warn",
}
_VERSION = re.compile(r"^(\d+)\.(\d+)$")
_SAFE_LINK = re.compile(r"^(/|#|https?://|\./|\.\./|[A-Za-z0-9_.\-]+(/|$|\?))")

Fetch = Callable[[str, dict[str, Any]], list[dict[str, Any]]]
# A typed link target -> its href on this portal, or None when the portal has no page for it.
Resolve = Callable[[Target], "str | None"]


@dataclass
class RenderContext:
    """What a render needs from outside: a way to run a query, the node shown, the clock."""

    fetch: Fetch  # (query, params) -> rows; any exception means "data unavailable"
    node: str | None = None  # the node a panel shows: the value of "$node"
    now: float = 0.0
    resolve: Resolve | None = None  # typed link targets; None: only https urls are links
    _next: int = field(default=0, repr=False)

    def next_cid(self) -> str:
        self._next += 1
        return f"c{self._next}"


class _SourceFailed(Exception):
    pass


# -- cells ----------------------------------------------------------------------------------


def _cell(text: str, ctype: str, *, tone: str | None = None, title: str | None = None,
          wrong: bool = False) -> dict[str, Any]:
    return {"text": text, "type": ctype, "tone": tone, "title": title, "wrong": wrong}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _when(v: Any) -> float | None:
    """Unix seconds from a number or an ISO 8601 string; None when it is neither."""
    if _is_number(v):
        return float(v)
    if isinstance(v, str):
        try:
            d = _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            return None
        if d.tzinfo is None:
            d = d.replace(tzinfo=_dt.timezone.utc)
        return d.timestamp()
    return None


def iso_text(t: float) -> str:
    try:
        return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return WRONG


def ago_text(delta: float) -> str:
    future = delta < 0
    d = abs(delta)
    if d < 1:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if d >= size:
            n = int(d // size)
            return f"in {n} {unit}" if future else f"{n} {unit} ago"
    return "just now"  # pragma: no cover - unreachable


def tone_for(value: str, tones: Any) -> str:
    if isinstance(tones, dict):
        t = tones.get(value)
        if t in TONES:
            return str(t)
    return DEFAULT_TONES.get(value.lower(), "neutral")


def format_cell(value: Any, ctype: Any, *, now: float, tones: Any = None,
                missing: bool = False) -> dict[str, Any]:
    """One value formatted for a column type; wrong type -> "—", null -> empty."""
    kind = ctype if isinstance(ctype, str) and ctype in COLUMN_TYPES else "text"
    if missing:
        return _cell(WRONG, kind, title="no such field in the row", wrong=True)
    if value is None:
        return _cell("", kind)
    wrong = _cell(WRONG, kind, title=f"not a valid {kind} value", wrong=True)
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return _cell(str(value), kind)
        return wrong
    if kind == "number":
        if _is_number(value):
            return _cell(str(value) if isinstance(value, int) else f"{value:.6g}", kind)
        return wrong
    if kind == "bool":
        if isinstance(value, bool):
            return _cell("yes" if value else "no", kind)
        return wrong
    if kind == "status":
        if isinstance(value, str):
            return _cell(value, kind, tone=tone_for(value, tones))
        if isinstance(value, bool):
            text = "true" if value else "false"
            return _cell(text, kind, tone=tone_for(text, tones))
        return wrong
    if kind == "code":
        if isinstance(value, str) or (_is_number(value)):
            return _cell(str(value), kind)
        return wrong
    if kind in ("relative_time", "timestamp"):
        t = _when(value)
        if t is None:
            return wrong
        iso = iso_text(t)
        if kind == "timestamp":
            return _cell(iso, kind)
        return _cell(ago_text(now - t), kind, title=iso)
    # text, and column types this console does not know ("and more"): shown as text.
    if isinstance(value, str):
        return _cell(value, kind)
    if isinstance(value, bool):
        return _cell("true" if value else "false", kind)
    if _is_number(value):
        return _cell(str(value) if isinstance(value, int) else f"{value:.6g}", kind)
    return wrong


# -- components -----------------------------------------------------------------------------


def _placeholder(text: str, detail: str = "", why: str = "") -> dict[str, Any]:
    """``why`` is shown beside ``text``; ``detail`` only on hover."""
    return {"kind": "placeholder", "text": text, "detail": detail, "why": why, "id": None}


def _requires_gate(comp: dict[str, Any]) -> str | None:
    """The placeholder text when the component needs a newer contract, else None."""
    req = comp.get("requires")
    if req is None:
        return None
    m = _VERSION.match(req) if isinstance(req, str) else None
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
        raise _SourceFailed("params must be an object")
    out: dict[str, Any] = {}
    for k, v in raw.items():
        if v == "$node":
            if ctx.node is None:
                raise _SourceFailed("$node used where no node is shown")
            v = ctx.node
        out[k] = v
    return out


def _rows(source: Any, ctx: RenderContext) -> list[dict[str, Any]]:
    """Run a component's source; _SourceFailed (with a reason) for anything that goes wrong."""
    if not isinstance(source, dict) or not isinstance(source.get("query"), str):
        raise _SourceFailed("the source has no query")
    params = _params(source.get("params"), ctx)
    try:
        rows = ctx.fetch(source["query"], params)
    except Exception as e:  # any failure of the source is shown, never raised into the page
        raise _SourceFailed(str(e) or type(e).__name__) from e
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise _SourceFailed("the query did not return a list of rows")
    fields = source.get("fields")
    if isinstance(fields, list) and all(isinstance(f, str) for f in fields):
        rows = [{f: r[f] for f in fields if f in r} for r in rows]
    return rows


def _specs(raw: Any) -> list[dict[str, Any]] | None:
    """Table columns as dicts with key/label/type/tones; None when malformed."""
    if not isinstance(raw, list):
        return None
    out = []
    for item in raw:
        if isinstance(item, str):
            item = {"key": item}
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            return None
        label = item.get("label")
        out.append({"key": item["key"], "label": label if isinstance(label, str) else item["key"],
                    "type": item.get("type") or "text", "tones": item.get("tones")})
    return out


def _value(row: dict[str, Any], spec: dict[str, Any], now: float) -> dict[str, Any]:
    key = spec["key"]
    return format_cell(row.get(key), spec["type"], now=now, tones=spec["tones"],
                       missing=key not in row)


def _table(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    columns = _specs(comp.get("columns"))
    if columns is None:
        return _placeholder(NOT_SUPPORTED, "table columns are malformed")
    view: dict[str, Any] = {"kind": "table", "cid": ctx.next_cid(),
                            "columns": [{"label": c["label"], "key": c["key"],
                                         "type": c["type"]} for c in columns],
                            "rows": [], "unavailable": False, "reason": ""}
    try:
        rows = _rows(comp.get("source"), ctx)
    except _SourceFailed as e:
        return view | {"unavailable": True, "reason": str(e)}
    view["rows"] = [[_value(r, c, ctx.now) for c in columns] for r in rows]
    return view


def _status(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    label = comp.get("label")
    view: dict[str, Any] = {"kind": "status", "cid": ctx.next_cid(),
                            "label": label if isinstance(label, str) else "",
                            "value": _cell("", "status"), "unavailable": False, "reason": ""}
    fld = comp.get("field")
    try:
        if not isinstance(fld, str):
            raise _SourceFailed("status has no field")
        rows = _rows(comp.get("source"), ctx)
    except _SourceFailed as e:
        return view | {"unavailable": True, "reason": str(e)}
    if rows:
        view["value"] = format_cell(rows[0].get(fld), "status", now=ctx.now,
                                    tones=comp.get("tones"), missing=fld not in rows[0])
    else:
        view["value"] = _cell(WRONG, "status", title="no rows", wrong=True)
    return view


def _kv_items(raw: Any) -> list[KvItem] | None:
    if not isinstance(raw, list):
        return None
    items = []
    for entry in raw:
        item, problems = kv_item(entry)
        if item is None or problems:
            return None
        items.append(item)
    return items


def _kv(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    items = _kv_items(comp.get("items"))
    if items is None:
        return _placeholder(NOT_SUPPORTED, "kv items are malformed")
    view: dict[str, Any] = {"kind": "kv", "cid": ctx.next_cid(),
                            "items": [{"label": i.label, "value": _cell("", i.type)}
                                      for i in items],
                            "unavailable": False, "reason": ""}
    row = None
    if any(not i.literal for i in items):  # literal values alone read no data
        try:
            rows = _rows(comp.get("source"), ctx)
        except _SourceFailed as e:
            return view | {"unavailable": True, "reason": str(e)}
        row = rows[0] if rows else None
    for item, out in zip(items, view["items"], strict=True):
        if item.literal:
            out["value"] = format_cell(item.value, item.type, now=ctx.now, tones=item.tones)
        elif row is None:
            out["value"] = _cell(WRONG, item.type, title="no rows", wrong=True)
        else:
            assert item.field is not None
            out["value"] = format_cell(row.get(item.field), item.type, now=ctx.now,
                                       tones=item.tones, missing=item.field not in row)
    return view


def _link(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    text = comp.get("text")
    target, _problems = link_target(comp.get("to"))
    if not isinstance(text, str):
        text = target.value if target is not None else WRONG
    href, why = None, "not a plain link"
    if target is None:
        why = "the link's target is malformed"
    elif target.kind == "path":
        to = target.value
        if ctx.node is not None:
            to = to.replace("$node", quote(ctx.node, safe=""))
        # Only plain links: a "javascript:" or "data:" target is shown as text, not followed.
        if _SAFE_LINK.match(to):
            href = to
    elif target.kind == "url":
        href = target.value  # https only: the reader refuses anything else
    else:
        if target.value == "$node" and ctx.node is not None:
            target = Target(target.kind, ctx.node)
        href = ctx.resolve(target) if ctx.resolve is not None else None
        why = f"this portal has no page for {target.kind} {target.value}"
    view = {"kind": "link", "text": text, "href": href}
    if href is None:
        view["why"] = why
    return view


def _component(comp: Any, ctx: RenderContext) -> dict[str, Any] | None:
    if not isinstance(comp, dict):
        return _placeholder(NOT_SUPPORTED, "a component must be an object")
    drop = comp.get("fallback") == "drop"
    gate = _requires_gate(comp)
    if gate is not None:
        return None if drop else _placeholder(gate, f"requires {comp.get('requires')!s}")
    ctype = comp.get("type")
    view: dict[str, Any] | None
    elsewhere = not_served(comp.get("source"), HOST_QUERIES)
    if ctype in UPSTREAM_COMPONENTS:
        return None if drop else _placeholder(NOT_SUPPORTED, f"component type {ctype}",
                                              f"{ctype}: {UPSTREAM_COMPONENTS[ctype]}")
    if elsewhere is not None and ctype in ("table", "status", "kv"):
        return None if drop else _placeholder(NOT_SERVED, f"{ctype} of {elsewhere}",
                                              f"{ctype} of {elsewhere}")
    if ctype == "section" or ctype == "columns":
        title = comp.get("title")
        view = {"kind": "section", "title": title if isinstance(title, str) else "",
                "children": _container(comp.get("children"), ctx)}
    elif ctype == "text":
        text = comp.get("text")
        view = {"kind": "text", "text": text if isinstance(text, str) else WRONG}
    elif ctype == "table":
        view = _table(comp, ctx)
    elif ctype == "status":
        view = _status(comp, ctx)
    elif ctype == "kv":
        view = _kv(comp, ctx)
    elif ctype == "link":
        view = _link(comp, ctx)
    else:
        return None if drop else _placeholder(NOT_SUPPORTED, f"component type {ctype!s}")
    view["id"] = comp["id"] if isinstance(comp.get("id"), str) else None
    return view


def _container(items: Any, ctx: RenderContext) -> list[dict[str, Any]]:
    if not isinstance(items, list):
        return [_placeholder(NOT_SUPPORTED, "expected a list of components")]
    out = [v for v in (_component(c, ctx) for c in items[:MAX_PER_CONTAINER]) if v is not None]
    if len(items) > MAX_PER_CONTAINER:
        extra = len(items) - MAX_PER_CONTAINER
        out.append(_placeholder(f"{extra} more components not shown "
                                f"(at most {MAX_PER_CONTAINER} per container)"))
    return out


def build_view(page: Any, ctx: RenderContext) -> dict[str, Any]:
    """The view of a whole page or panel document."""
    if not isinstance(page, dict):
        return {"title": "", "body": [_placeholder(NOT_SUPPORTED, "a page must be an object")]}
    title = page.get("title") if isinstance(page.get("title"), str) else ""
    contract = page.get("ui_contract")
    m = _VERSION.match(contract) if isinstance(contract, str) else None
    if m and int(m.group(1)) != HOST_CONTRACT[0]:
        return {"title": title, "body": [_placeholder(NEEDS_CONTRACT.format(contract))]}
    return {"title": title, "body": _container(page.get("body"), ctx)}


def data_views(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The data-bound parts of a view (tables, statuses, kvs) by cid: what a refresh sends."""
    out: dict[str, dict[str, Any]] = {}

    def walk(items: list[dict[str, Any]]) -> None:
        for v in items:
            if v["kind"] == "section":
                walk(v["children"])
            elif "cid" in v:
                out[v["cid"]] = v

    walk(view["body"])
    return out
