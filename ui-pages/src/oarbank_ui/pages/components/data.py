"""Data components: ``table`` (typed columns, formats, ``direction`` tones, paging and
sorting), ``json`` and ``logs``.

Paging and sorting happen on the server, from the page's own query arguments
(``<table>.sort=<column>``, ``<table>.desc=1``, ``<table>.page=<n>``; ``<table>`` is the
component's ``id``, else its position ``c<N>``): plain links, no script. A static preview
has no server to follow them: it shows the first page, sorted as the source gives it, and
says how many pages there are. ``page_size`` is 5 to 200 (default 25); a column sorts unless
it says ``"sortable": false``.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from ...queries.shape import sort_key
from .base import RenderContext, SourceFailed, malformed, rows_of, string_prop
from .elsewhere import OPERATION
from .formats import direction_tones, format_cell, is_number, when_of

__all__ = ["json_view", "logs", "table"]

MAX_JSON = 20_000  # characters of a json component's text
DEFAULT_PAGE = 25


def _specs(raw: Any) -> list[dict[str, Any]] | None:
    """Table columns as dicts; None when malformed."""
    if not isinstance(raw, list) or not raw:
        return None
    out = []
    for item in raw:
        if isinstance(item, str):
            item = {"key": item}
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            return None
        label = item.get("label")
        out.append({"key": item["key"], "label": label if isinstance(label, str) else item["key"],
                    "type": item.get("type") or "text", "tones": item.get("tones"),
                    "format": item.get("format"), "unit": item.get("unit"),
                    "direction": item.get("direction"),
                    "by_sign": item.get("tone_by_sign") is True,
                    "sortable": item.get("sortable", True) is not False})
    return out


def _href(ctx: RenderContext, changes: dict[str, str | None]) -> str:
    args = dict(ctx.args or {})
    for k, v in changes.items():
        if v is None:
            args.pop(k, None)
        else:
            args[k] = v
    args.pop("format", None)
    return "?" + urlencode(sorted(args.items())) if args else "?"


def _int_arg(ctx: RenderContext, key: str, default: int) -> int:
    raw = (ctx.args or {}).get(key, "")
    return int(raw) if raw.isdigit() else default


def table(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    columns = _specs(comp.get("columns"))
    if columns is None:
        return malformed("table", "table columns are malformed")
    size = comp.get("page_size", DEFAULT_PAGE)
    if isinstance(size, bool) or not isinstance(size, int) or not 5 <= size <= 200:
        return malformed("table", f"page_size must be a whole number from 5 to 200, got {size!r}")
    cid = ctx.next_cid()
    key = comp["id"] if isinstance(comp.get("id"), str) else cid
    live = ctx.args is not None
    sort = (ctx.args or {}).get(f"{key}.sort")
    keys = {c["key"]: c for c in columns}
    if sort not in keys or not keys[sort]["sortable"]:
        sort = None
    desc = (ctx.args or {}).get(f"{key}.desc") == "1"
    view: dict[str, Any] = {
        "kind": "table", "cid": cid, "anchor": f"t-{key}",
        "columns": [{"label": c["label"], "key": c["key"], "type": c["type"],
                     "sorted": ("desc" if desc else "asc") if c["key"] == sort else None,
                     "href": (_href(ctx, {f"{key}.sort": c["key"], f"{key}.page": None,
                                          f"{key}.desc": "1" if c["key"] == sort and not desc
                                          else None}) + f"#t-{key}")
                     if live and c["sortable"] else None} for c in columns],
        "rows": [], "unavailable": False, "reason": "", "pager": None, "note": ""}
    if isinstance(comp.get("row_actions"), list) and comp["row_actions"]:
        view["note"] = f"row actions not shown: {OPERATION}"
    try:
        rows = rows_of(comp.get("source"), ctx)
    except SourceFailed as e:
        return view | {"unavailable": True, "reason": str(e)}
    if sort is not None:
        kind = keys[sort]["type"]
        rows = sorted(rows, key=lambda r: sort_key(when_of(r.get(sort)) if kind in (
            "relative_time", "timestamp") else r.get(sort)), reverse=desc)
    tones = {c["key"]: direction_tones([r.get(c["key"]) for r in rows], c["direction"],
                                       c["by_sign"]) for c in columns if c["direction"]}
    pages = max(1, -(-len(rows) // size))
    page = min(max(1, _int_arg(ctx, f"{key}.page", 1)), pages) if live else 1
    first = (page - 1) * size
    shown = []
    for i in range(first, min(first + size, len(rows))):
        r, line = rows[i], []
        for c in columns:
            out = format_cell(r.get(c["key"]), c["type"], now=ctx.now, tones=c["tones"],
                              missing=c["key"] not in r, fmt=c["format"], unit=c["unit"],
                              resolve=_node_href(ctx))
            if c["key"] in tones and not out["wrong"]:
                tone, title = tones[c["key"]][i]
                if tone is not None:
                    out["tone"], out["title"] = tone, title
            line.append(out)
        shown.append(line)
    view["rows"] = shown
    if pages > 1:
        view["pager"] = {
            "page": page, "pages": pages, "rows": len(rows),
            "prev": _href(ctx, {f"{key}.page": str(page - 1)}) + f"#t-{key}"
            if live and page > 1 else None,
            "next": _href(ctx, {f"{key}.page": str(page + 1)}) + f"#t-{key}"
            if live and page < pages else None,
            "static": not live}
    return view


def _node_href(ctx: RenderContext) -> Any:
    if ctx.resolve is None:
        return None
    from oarbank_sdk.page_forms import Target

    resolve = ctx.resolve
    return lambda node: resolve(Target("node", node))


def json_view(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    """The source's rows as indented JSON text (escaped like every text)."""
    view: dict[str, Any] = {"kind": "json", "cid": ctx.next_cid(), "text": "",
                            "unavailable": False, "reason": ""}
    try:
        rows = rows_of(comp.get("source"), ctx)
    except SourceFailed as e:
        return view | {"unavailable": True, "reason": str(e)}
    doc: Any = rows[0] if len(rows) == 1 else rows
    text = json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(text) > MAX_JSON:
        text = text[:MAX_JSON] + f"\n… ({len(text) - MAX_JSON} more characters)"
    return view | {"text": text}


def logs(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    """Lines from a source (``field``, default ``line``; ``time_field`` shown before each), in
    a monospace block. Upstream's form without a source names a log stream (``module``,
    ``job``, ``attempt``) that its coordinator keeps: a placeholder here."""
    if comp.get("source") is None:
        stream = string_prop(comp, "stream", "module")
        return malformed("logs", f"the {stream} log stream is kept by upstream's coordinator, "
                                 "not by this portal (give a source to show rows as lines)")
    fld = string_prop(comp, "field", "line")
    tfield = comp.get("time_field")
    view: dict[str, Any] = {"kind": "logs", "cid": ctx.next_cid(), "lines": [],
                            "unavailable": False, "reason": ""}
    try:
        rows = rows_of(comp.get("source"), ctx)
    except SourceFailed as e:
        return view | {"unavailable": True, "reason": str(e)}
    lines = []
    for r in rows:
        v = r.get(fld)
        text = v if isinstance(v, str) else "" if v is None else str(v) if is_number(v) else "—"
        at = ""
        if isinstance(tfield, str):
            at = format_cell(r.get(tfield), "timestamp", now=ctx.now)["text"]
        lines.append({"at": at, "text": text})
    return view | {"lines": lines}
