"""The UI contract's components, one module per family: ``layout`` (section, tabs, columns),
``display`` (text, markdown, kv, stat, status, progress, callout, empty, link), ``data``
(table, json, logs), ``chart``, and ``elsewhere`` (what needs upstream's coordinator: form,
action, filter_bar, media, gallery, compare, iframe: placeholders that say why). ``base``
holds the context and the source, ``shape`` the source's group_by/agg/order_by/limit,
``formats`` values as text, ``when`` visibility, ``markdown`` the markdown subset.

``build_view(page, ctx)`` turns a page document into a view (plain dicts; ``render.py``
states the rules); ``data_views(view)`` is what a page's refresh sends.
"""

from __future__ import annotations

from typing import Any

from oarbank_sdk.page_forms import NOT_SERVED, not_served

from . import data, display, layout
from .base import (
    HOST_CONTRACT,
    MAX_PER_CONTAINER,
    NEEDS_CONTRACT,
    NOT_SUPPORTED,
    VERSION,
    RenderContext,
    placeholder,
    requires_gate,
)
from .chart import chart
from .elsewhere import COORDINATOR, coordinator_placeholder
from .when import WhenError, evaluate

__all__ = ["PORTAL_QUERIES", "RenderContext", "build_view", "data_views"]

# Every host query this portal answers.
PORTAL_QUERIES = ("services", "nodes", "node_metrics", "jobs", "attempts")
_DRAWN = {
    "text": display.text, "markdown": display.markdown, "kv": display.kv,
    "stat": display.stat, "status": display.status, "progress": display.progress,
    "callout": display.callout, "empty": display.empty, "link": display.link,
    "table": data.table, "json": data.json_view, "logs": data.logs, "chart": chart,
}
_LAYOUT = {"section": layout.section, "columns": layout.columns, "tabs": layout.tabs}
# What a refresh redraws (portal.js knows these); charts redraw with the page.
REFRESHED = ("table", "status", "kv", "stat", "progress", "json", "logs")


def when_context(ctx: RenderContext) -> dict[str, Any]:
    node = dict(ctx.subject.get("node") or {})
    if ctx.node is not None:
        node.setdefault("id", ctx.node)
    return {"node": node, "user": {"role": "viewer"}, "job": {}, "row": {}, "setting": {},
            "self": ctx.subject.get("self")}


def _component(comp: Any, ctx: RenderContext) -> dict[str, Any] | None:
    if not isinstance(comp, dict):
        return placeholder(NOT_SUPPORTED, "a component must be an object")
    drop = comp.get("fallback") == "drop"
    gate = requires_gate(comp)
    if gate is not None:
        return None if drop else placeholder(gate, f"requires {comp.get('requires')!s}")
    ctype = comp.get("type")
    if "when" in comp:
        try:
            if not evaluate(comp["when"], when_context(ctx)):
                return None
        except WhenError as e:
            return placeholder(NOT_SUPPORTED, f"when: {e}", f"{ctype!s}: when: {e}")
    if isinstance(ctype, str) and ctype in COORDINATOR:
        return None if drop else coordinator_placeholder(ctype, comp)
    elsewhere = not_served(comp.get("source"), PORTAL_QUERIES)
    if elsewhere is not None and ctype in _DRAWN:
        return None if drop else placeholder(NOT_SERVED, f"{ctype} of {elsewhere}",
                                             f"{ctype} of {elsewhere}")
    view: dict[str, Any]
    if isinstance(ctype, str) and ctype in _LAYOUT:
        view = _LAYOUT[ctype](comp, ctx, container)
    elif isinstance(ctype, str) and ctype in _DRAWN:
        view = _DRAWN[ctype](comp, ctx)
    else:
        return None if drop else placeholder(NOT_SUPPORTED, f"component type {ctype!s}")
    if view["kind"] == "placeholder":
        return None if drop else view  # a known component with malformed props
    view["id"] = comp["id"] if isinstance(comp.get("id"), str) else None
    return view


def container(items: Any, ctx: RenderContext) -> list[dict[str, Any]]:
    if not isinstance(items, list):
        return [placeholder(NOT_SUPPORTED, "expected a list of components")]
    out = [v for v in (_component(c, ctx) for c in items[:MAX_PER_CONTAINER]) if v is not None]
    if len(items) > MAX_PER_CONTAINER:
        extra = len(items) - MAX_PER_CONTAINER
        out.append(placeholder(f"{extra} more components not shown "
                               f"(at most {MAX_PER_CONTAINER} per container)"))
    return out


def build_view(page: Any, ctx: RenderContext) -> dict[str, Any]:
    """The view of a whole page or panel document."""
    if not isinstance(page, dict):
        return {"title": "", "body": [placeholder(NOT_SUPPORTED, "a page must be an object")]}
    title = page.get("title") if isinstance(page.get("title"), str) else ""
    contract = page.get("ui_contract")
    m = VERSION.match(contract) if isinstance(contract, str) else None
    if m and int(m.group(1)) != HOST_CONTRACT[0]:
        return {"title": title, "body": [placeholder(NEEDS_CONTRACT.format(contract))]}
    return {"title": title, "body": container(page.get("body"), ctx)}


def data_views(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The data-bound parts of a view by cid: what a refresh sends (``REFRESHED`` kinds)."""
    out: dict[str, dict[str, Any]] = {}

    def walk(items: list[dict[str, Any]]) -> None:
        for v in items:
            if v["kind"] in ("section", "columns"):
                walk(v["children"])
            elif v["kind"] == "tabs":
                for tab in v["tabs"]:
                    walk(tab["children"])
            elif v["kind"] in REFRESHED and "cid" in v:
                out[v["cid"]] = v

    walk(view["body"])
    return out
