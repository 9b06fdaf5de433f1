"""Display components: ``text``, ``markdown``, ``kv``, ``stat``, ``status``, ``progress``,
``callout``, ``empty`` and ``link``."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from oarbank_sdk.page_forms import KvItem, Target, kv_item, link_target

from .base import WRONG, RenderContext, SourceFailed, malformed, rows_of, string_prop
from .elsewhere import OPERATION
from .formats import TONES, cell, format_cell, is_number
from .markdown import render_markdown

__all__ = ["callout", "empty", "kv", "link", "markdown", "progress", "stat", "status", "text"]

_SAFE_LINK_START = ("/", "#", "https://", "http://", "./", "../")


def _tone(comp: dict[str, Any], default: str | None) -> str | None:
    t = comp.get("tone")
    return t if t in TONES else default


def text(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    t = comp.get("text")
    return {"kind": "text", "text": t if isinstance(t, str) else WRONG, "tone": _tone(comp, None)}


def markdown(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    t = comp.get("text")
    if not isinstance(t, str):
        return malformed("markdown", "text must be a string")
    return {"kind": "markdown", "html": render_markdown(t, ctx.resolve)}


def callout(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    t = comp.get("text")
    if not isinstance(t, str):
        return malformed("callout", "text must be a string")
    return {"kind": "callout", "text": t[:3000], "tone": _tone(comp, "info")}


def empty(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    t = comp.get("text")
    if not isinstance(t, str):
        return malformed("empty", "text must be a string")
    why = f"its action: {OPERATION}" if comp.get("action") is not None else ""
    return {"kind": "empty", "text": t[:3000], "why": why}


def status(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    view: dict[str, Any] = {"kind": "status", "cid": ctx.next_cid(),
                            "label": string_prop(comp, "label"),
                            "value": cell("", "status"), "unavailable": False, "reason": ""}
    fld = comp.get("field")
    try:
        if not isinstance(fld, str):
            raise SourceFailed("status has no field")
        rows = rows_of(comp.get("source"), ctx)
    except SourceFailed as e:
        return view | {"unavailable": True, "reason": str(e)}
    if rows:
        view["value"] = format_cell(rows[0].get(fld), "status", now=ctx.now,
                                    tones=comp.get("tones"), missing=fld not in rows[0])
    else:
        view["value"] = cell(WRONG, "status", title="no rows", wrong=True)
    return view


def _spark(values: list[float]) -> str:
    """A sparkline's polyline points in a 120 x 28 box."""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    step = 120 / max(1, len(values) - 1)
    return " ".join(f"{i * step:.1f},{26 - (v - lo) / span * 24:.1f}" for i, v in enumerate(values))


def stat(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    fld = comp.get("field")
    if not isinstance(fld, str):
        return malformed("stat", "field must name a field of the source's first row")
    direction = comp.get("direction")
    view: dict[str, Any] = {"kind": "stat", "cid": ctx.next_cid(),
                            "label": string_prop(comp, "label", fld),
                            "value": cell("", "number"), "spark": "", "unavailable": False,
                            "reason": "", "trend": ""}
    try:
        rows = rows_of(comp.get("source"), ctx)
    except SourceFailed as e:
        return view | {"unavailable": True, "reason": str(e)}
    if not rows:
        return view | {"value": cell(WRONG, "number", title="no rows", wrong=True)}
    value = rows[0].get(fld)
    ctype = "integer" if isinstance(value, int) and not isinstance(value, bool) else "number"
    view["value"] = format_cell(value, comp.get("type") or ctype, now=ctx.now,
                                fmt=comp.get("format"), unit=comp.get("unit"),
                                missing=fld not in rows[0])
    spark = comp.get("sparkline")
    if isinstance(spark, str):
        series = [float(r[spark]) for r in rows if is_number(r.get(spark))]
        if len(series) >= 2:
            view["spark"] = _spark(series)
            if direction in ("min", "max") and series[-1] != series[-2]:
                better = (series[-1] > series[-2]) == (direction == "max")
                view["value"]["tone"] = "ok" if better else "warn"
                view["trend"] = "better than the point before" if better else "worse than the point before"
    return view


def progress(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    vf, tf = comp.get("value"), comp.get("total")
    if not isinstance(vf, str) or not isinstance(tf, str):
        return malformed("progress", "value and total must name fields of the source's first row")
    view: dict[str, Any] = {"kind": "progress", "cid": ctx.next_cid(),
                            "label": string_prop(comp, "label"), "text": "", "fraction": None,
                            "wrong": False, "unavailable": False, "reason": ""}
    try:
        rows = rows_of(comp.get("source"), ctx)
    except SourceFailed as e:
        return view | {"unavailable": True, "reason": str(e)}
    row = rows[0] if rows else {}
    done: Any = row.get(vf)
    total: Any = row.get(tf)
    if not (is_number(done) and is_number(total)) or total <= 0 or done < 0:
        return view | {"text": WRONG, "wrong": True}
    frac = min(1.0, done / total)
    shown = f"{done:g} / {total:g} ({frac:.0%})"
    return view | {"text": shown, "fraction": round(frac * 100, 1)}


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


def kv(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    items = _kv_items(comp.get("items"))
    if items is None:
        return malformed("kv", "kv items are malformed")
    view: dict[str, Any] = {"kind": "kv", "cid": ctx.next_cid(),
                            "items": [{"label": i.label, "value": cell("", i.type)}
                                      for i in items],
                            "unavailable": False, "reason": ""}
    row = None
    if any(not i.literal for i in items):  # literal values alone read no data
        try:
            rows = rows_of(comp.get("source"), ctx)
        except SourceFailed as e:
            return view | {"unavailable": True, "reason": str(e)}
        row = rows[0] if rows else None
    for item, out in zip(items, view["items"], strict=True):
        if item.literal:
            out["value"] = format_cell(item.value, item.type, now=ctx.now, tones=item.tones,
                                       fmt=item.format)
        elif row is None:
            out["value"] = cell(WRONG, item.type, title="no rows", wrong=True)
        else:
            assert item.field is not None
            out["value"] = format_cell(row.get(item.field), item.type, now=ctx.now,
                                       tones=item.tones, missing=item.field not in row,
                                       fmt=item.format)
    return view


def _safe_path(to: str) -> bool:
    """Only plain links: a "javascript:" or "data:" target is shown as text, not followed."""
    if to.startswith(_SAFE_LINK_START):
        return not to.startswith("//")
    head = to.split("/", 1)[0].split("?", 1)[0]
    return bool(head) and ":" not in head and all(c.isalnum() or c in "_.-" for c in head)


def link(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    label = comp.get("text")
    target, _problems = link_target(comp.get("to"))
    if not isinstance(label, str):
        label = target.value if target is not None else WRONG
    href, why = None, "not a plain link"
    if target is None:
        why = "the link's target is malformed"
    elif target.kind == "path":
        to = target.value
        if ctx.node is not None:
            to = to.replace("$node", quote(ctx.node, safe=""))
        if _safe_path(to):
            href = to
    elif target.kind == "url":
        href = target.value  # https only: the reader refuses anything else
    else:
        if target.value == "$node" and ctx.node is not None:
            target = Target(target.kind, ctx.node)
        href = ctx.resolve(target) if ctx.resolve is not None else None
        why = f"this portal has no page for {target.kind} {target.value}"
    view = {"kind": "link", "text": label, "href": href}
    if href is None:
        view["why"] = why
    return view

