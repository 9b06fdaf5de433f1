"""The portal's requests, free of sockets: ``Portal.handle(method, path, query, body)`` returns
a ``Response``. ``server.py`` puts it behind a TCP or unix-socket HTTP server.

Routes:
  POST /v1/heartbeat                                   a node's report (contract section 6)
  GET  /v1/queries/services?module=M[&node_id=][&service=]   JSON list of rows (<= 200)
  GET  /v1/nodes                                       JSON list of nodes that reported
  GET  /                                               index of modules and nodes
  GET  /modules/<module>/pages/<page id>[?format=json]
  GET  /nodes/<node id>/modules/<module>/panels/<panel id>[?format=json]
  GET  /static/<file>
``?format=json`` answers the page's data view: what the page's script redraws every few
seconds. ``<module>`` is a module id or its short name.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any
from urllib.parse import quote, unquote

from oarbank_sdk._page_forms import Target

from .heartbeat import HeartbeatError, parse_heartbeat
from .html import Templates, clock_text
from .modules import PageFileError, PortalModule, find_module
from .render import RenderContext, ago_text, build_view, data_views, iso_text
from .services_query import MAX_ROWS, QueryError
from .store import HeartbeatStore

__all__ = ["MAX_BODY", "Portal", "Response", "services_fetch"]

log = logging.getLogger("oarbank_ui.portal")
MAX_BODY = 1 << 20  # a heartbeat of a big node is a few tens of KiB
_STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
# Pages draw only what the portal sends; scripts only from the portal itself. Escaping is what
# keeps markup out; this is a second lock on the same door.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


def _json(status: int, doc: Any) -> Response:
    return Response(status, (json.dumps(doc) + "\n").encode(), "application/json")


def _error(status: int, message: str) -> Response:
    return _json(status, {"error": message})


def _page_href(module_id: str, page_id: str) -> str:
    return f"/modules/{quote(module_id, safe='')}/pages/{quote(page_id, safe='')}"


def _panel_href(node_id: str, module_id: str, panel_id: str) -> str:
    return (f"/nodes/{quote(node_id, safe='')}/modules/{quote(module_id, safe='')}"
            f"/panels/{quote(panel_id, safe='')}")


def services_fetch(store: HeartbeatStore, module: PortalModule) -> Callable[..., Any]:
    """The query runner a module's pages use: only ``services``, with ``node_id``/``service``."""

    def fetch(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        if query != "services":
            raise QueryError(f"unknown query {query!r} (this portal answers: services)")
        for k, v in params.items():
            if k not in ("node_id", "service"):
                raise QueryError(f"services: unknown parameter {k!r} (node_id, service)")
            if not isinstance(v, str):
                raise QueryError(f"services: parameter {k} must be a string")
        return store.services(module.names, node_id=params.get("node_id"),
                              service=params.get("service"))

    return fetch


def link_resolver(module: PortalModule) -> Callable[[Target], str | None]:
    """Where a typed link target of ``module``'s pages goes on this portal: ``page`` -> that
    page of the module, ``node`` -> the module's first panel for that node. ``job``,
    ``dataset``, ``campaign`` and ``tab`` have no page here: None (shown as text)."""

    def resolve(target: Target) -> str | None:
        if target.kind == "page" and module.entry("page", target.value) is not None:
            return _page_href(module.id, target.value)
        if target.kind == "node" and module.manifest.panels:
            return _panel_href(target.value, module.id, module.manifest.panels[0].id)
        return None

    return resolve


class Portal:
    def __init__(self, store: HeartbeatStore, modules: dict[str, PortalModule], *,
                 refresh_s: float = 3.0, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.modules = modules
        self.refresh_ms = int(refresh_s * 1000)
        self.clock = clock
        self.templates = Templates()

    # -- dispatch --------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: bytes = b"") -> Response:
        parts = [unquote(p) for p in path.split("/") if p]
        try:
            if parts == ["v1", "heartbeat"]:
                if method != "POST":
                    return _error(405, "POST a heartbeat here")
                return self.heartbeat(body)
            if method not in ("GET", "HEAD"):
                return _error(405, f"{method} is not allowed on {path}")
            if not parts:
                return self.index()
            if parts == ["v1", "queries", "services"]:
                return self.services_query(query)
            if parts == ["favicon.ico"]:
                return Response(204, b"", "image/x-icon")  # browsers ask; nothing to show
            if parts == ["v1", "nodes"]:
                return _json(200, self.store.nodes())
            if len(parts) == 2 and parts[0] == "static":
                return self.static(parts[1])
            as_json = query.get("format") == ["json"]
            if len(parts) == 4 and parts[0] == "modules" and parts[2] == "pages":
                return self.page(parts[1], "page", parts[3], node=None, as_json=as_json)
            if (len(parts) == 6 and parts[0] == "nodes" and parts[2] == "modules"
                    and parts[4] == "panels"):
                return self.page(parts[3], "panel", parts[5], node=parts[1], as_json=as_json)
        except Exception:  # a bug must cost one request, not the portal
            log.exception("error answering %s %s", method, path)
            return _error(500, "internal error; see the portal's log")
        return self._html_error(404, "Not found", f"nothing at {path}")

    # -- heartbeats and queries ------------------------------------------------------------

    def heartbeat(self, body: bytes) -> Response:
        try:
            doc = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            log.warning("heartbeat refused: not JSON (%s)", e)
            return _error(400, f"heartbeat: not JSON ({e})")
        try:
            hb = parse_heartbeat(doc)
        except HeartbeatError as e:
            log.warning("heartbeat refused: %s", e)
            return _error(400, f"heartbeat: {e}")
        result = self.store.record(hb, received_at=self.clock())
        return _json(200, {"ok": True, "applied": result.applied, "reason": result.reason or None,
                           "node_id": hb.node_id, "services": len(hb.services)})

    def services_query(self, query: dict[str, list[str]]) -> Response:
        for k, v in query.items():
            if k not in ("module", "node_id", "service"):
                return _error(400, f"services: unknown parameter {k!r} "
                                   "(module, node_id, service)")
            if len(v) != 1:
                return _error(400, f"services: parameter {k} given {len(v)} times")
        if "module" not in query or not query["module"][0]:
            return _error(400, "services: the module parameter is required")
        name = query["module"][0]
        mod = find_module(self.modules, name)
        # A module this portal has no folder for is still answered from what nodes report.
        names = mod.names if mod else (name,)
        rows, cut = self.store.services_page(names, node_id=query.get("node_id", [None])[0],
                                             service=query.get("service", [None])[0],
                                             limit=MAX_ROWS)
        resp = _json(200, rows)
        if cut:  # the body stays a plain list of rows (the fixture shape); the cut is said here
            resp.headers["X-Oarbank-Rows-Truncated"] = f"first {MAX_ROWS} rows; filter by node_id or service"
        return resp

    # -- pages -----------------------------------------------------------------------------

    def page(self, module_name: str, kind: str, entry_id: str, *, node: str | None,
             as_json: bool) -> Response:
        mod = find_module(self.modules, module_name)
        if mod is None:
            return self._html_error(404, "Unknown module", f"no module {module_name!r} here")
        entry = mod.entry(kind, entry_id)
        if entry is None:
            return self._html_error(404, f"Unknown {kind}",
                                    f"{mod.id} has no {kind} {entry_id!r}")
        try:
            doc, problems = mod.read(kind, entry)
        except PageFileError as e:
            return self._html_error(500, f"Broken {kind}", str(e))
        now = self.clock()
        view = build_view(doc, RenderContext(fetch=services_fetch(self.store, mod), node=node,
                                             now=now, resolve=link_resolver(mod)))
        if as_json:
            return _json(200, {"rendered_at": clock_text(now), "components": data_views(view)})
        if kind == "page":
            href = _page_href(mod.id, entry.id)
            subtitle = f"{mod.id} {mod.manifest.version}"
        else:
            href = _panel_href(node or "", mod.id, entry.id)
            subtitle = f"node {node} · {mod.id} {mod.manifest.version}"
        html = self.templates.render(
            "page.html", title=view["title"] or entry.title, subtitle=subtitle, view=view,
            kind=kind, problems=[str(p) for p in problems], refresh_url=href + "?format=json",
            refresh_ms=self.refresh_ms, rendered_at=clock_text(now),
            crumbs=[mod.short_name, entry.title])
        return self._html(200, html)

    def index(self) -> Response:
        now = self.clock()
        modules = []
        for m in self.modules.values():
            modules.append({
                "id": m.id, "version": m.manifest.version, "description": m.manifest.description,
                "pages": [{"title": p.title, "href": _page_href(m.id, p.id)}
                          for p in m.manifest.pages],
            })
        nodes = []
        for n in self.store.nodes():
            panels = []
            for name in n["modules"]:
                pm = find_module(self.modules, name)
                if pm is None:
                    continue  # reported, but this portal has no folder (no panels) for it
                for p in pm.manifest.panels:
                    panels.append({"title": f"{pm.short_name}: {p.title}",
                                   "href": _panel_href(n["node_id"], pm.id, p.id)})
            nodes.append(n | {"panels": panels, "reported_ago": ago_text(now - n["reported_at"]),
                              "reported_iso": iso_text(n["reported_at"])})
        html = self.templates.render("index.html", title="Modules and nodes", modules=modules,
                                     nodes=nodes)
        return self._html(200, html)

    def static(self, name: str) -> Response:
        suffix = name[name.rfind("."):] if "." in name else ""
        if suffix not in _STATIC_TYPES or "/" in name or name.startswith("."):
            return _error(404, f"no static file {name!r}")
        res = resources.files("oarbank_ui").joinpath("static", name)
        if not res.is_file():
            return _error(404, f"no static file {name!r}")
        return Response(200, res.read_bytes(), _STATIC_TYPES[suffix],
                        {"Cache-Control": "no-cache"})

    # -- helpers ---------------------------------------------------------------------------

    def _html(self, status: int, html: str) -> Response:
        return Response(status, html.encode(), "text/html; charset=utf-8",
                        {"Content-Security-Policy": _CSP, "Cache-Control": "no-store",
                         "X-Content-Type-Options": "nosniff"})

    def _html_error(self, status: int, title: str, message: str) -> Response:
        return self._html(status, self.templates.render("error.html", title=title,
                                                        message=message))
