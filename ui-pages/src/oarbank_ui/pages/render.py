"""UI contract renderer, decision half (contract section 7): the rules, in one place; the
components themselves live in ``components/`` (one module per family).

``build_view(page, ctx)`` turns a page or panel document into a *view*: plain dicts that say
exactly what to show (texts already formatted, tones chosen, placeholders decided, charts
drawn as SVG). The HTML templates (``templates/``, Jinja2 with autoescaping) and the page's
refresh script both draw that view, so every rule lives here once and is tested without a
browser.

Rules (a renderer never breaks on what it does not know):
- a component whose ``requires`` is newer than ``HOST_CONTRACT`` -> placeholder
  "needs UI contract 1.N" (or nothing with ``fallback = "drop"``);
- an unknown component type -> placeholder "not supported by this console version" (or
  nothing); a known one with malformed props -> the same placeholder naming the prop;
- ``when`` is evaluated here over the fixed context (``components/when.py``): false hides the
  component, a malformed expression is a placeholder naming the problem;
- a source that fails (unknown query, bad params or shaping, ``$node`` on a page without a
  node, the store failing) -> "data unavailable", the rest of the page renders;
- a value of the wrong type for its column -> "—"; a null value -> empty;
- at most 40 components per container; the rest are not rendered and a notice says how many;
- ``link.to`` and ``kv`` items are read in both forms (``oarbank_sdk.page_forms``); a typed
  target the portal cannot resolve renders as plain text, never as a broken link; markdown
  links follow the same rule, and nothing else (``javascript:``) is ever a link;
- what needs upstream's coordinator (``form``, ``action``, ``filter_bar``, ``media``,
  ``gallery``, ``compare``, ``iframe``; a module view source; an upstream query other than
  ``services``, ``nodes``, ``node_metrics``) is a placeholder that says why;
- nothing a module ships runs as script: its strings are escaped, markdown has raw HTML off,
  charts are SVG drawn here.
"""

from __future__ import annotations

from oarbank_sdk.page_forms import NOT_SERVED

from .components import PORTAL_QUERIES, build_view, data_views
from .components.base import (
    HOST_CONTRACT,
    MAX_PER_CONTAINER,
    NEEDS_CONTRACT,
    NOT_SUPPORTED,
    UNAVAILABLE,
    WRONG,
    RenderContext,
)
from .components.formats import ago_text, format_cell, iso_text

__all__ = [
    "HOST_CONTRACT",
    "MAX_PER_CONTAINER",
    "NEEDS_CONTRACT",
    "NOT_SERVED",
    "NOT_SUPPORTED",
    "PORTAL_QUERIES",
    "UNAVAILABLE",
    "WRONG",
    "RenderContext",
    "ago_text",
    "build_view",
    "data_views",
    "format_cell",
    "iso_text",
]
