"""Layout components: ``section`` (``span`` 1, 2 or full), ``tabs`` (up to 8, each with a title
and children) and ``columns`` (2 or 3 children side by side; stacked on a narrow screen).

Tabs switch without script: each tab is a ``<details>`` element, the first open, so every tab
stays reachable by keyboard and readable with styles off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import RenderContext, malformed, string_prop

__all__ = ["MAX_TABS", "columns", "section", "tabs"]

MAX_TABS = 8
Container = Callable[[Any, RenderContext], list[dict[str, Any]]]


def section(comp: dict[str, Any], ctx: RenderContext, container: Container) -> dict[str, Any]:
    span = comp.get("span", "full")
    return {"kind": "section", "title": string_prop(comp, "title"),
            "span": span if span in (1, 2) else "full",
            "children": container(comp.get("children"), ctx)}


def columns(comp: dict[str, Any], ctx: RenderContext, container: Container) -> dict[str, Any]:
    children = comp.get("children")
    if not isinstance(children, list) or not 2 <= len(children) <= 3:
        return malformed("columns", "children must be a list of 2 or 3 components")
    return {"kind": "columns", "children": container(children, ctx)}


def tabs(comp: dict[str, Any], ctx: RenderContext, container: Container) -> dict[str, Any]:
    raw = comp.get("tabs")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_TABS:
        return malformed("tabs", f"tabs must be a list of 1 to {MAX_TABS} tabs")
    out = []
    for i, tab in enumerate(raw):
        if not isinstance(tab, dict) or not isinstance(tab.get("title"), str):
            return malformed("tabs", f"tabs[{i}] must be an object with a title")
        out.append({"title": tab["title"][:80], "children": container(tab.get("children", []), ctx)})
    return {"kind": "tabs", "tabs": out}
