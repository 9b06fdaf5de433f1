"""The portal's pages over HTTP: a module's pages and a node's panels (HTML, or their data
views with ``?format=json``), the index of modules and nodes, and the pages' static files.
Drawing is ``pages/``'s; this module reads what a request names and answers it."""

from __future__ import annotations

import logging
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from oarbank_sdk.manifest import UiEntry

from ..pages import uicontract
from ..pages.html import Templates, clock_text
from ..pages.links import _page_href, _panel_href, link_resolver, services_fetch
from ..pages.modules import PageFileError, PortalModule, find_module
from ..pages.render import RenderContext, ago_text, build_view, data_views, iso_text
from ..queries.shape import Shaping
from ..store.heartbeats import HeartbeatStore
from .responses import Response, error_response, json_response

__all__ = ["PageRoutes"]

log = logging.getLogger("oarbank_ui.portal")
INDEX_NODES = 200  # the index lists this many nodes; /v1/nodes pages through the rest
_STATIC_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
# Pages draw only what the portal sends; scripts only from the portal itself. Escaping is what
# keeps markup out; this is a second lock on the same door.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class PageRoutes:
    def __init__(self, store: HeartbeatStore, modules: dict[str, PortalModule],
                 clock: Callable[[], float], *, refresh_ms: int) -> None:
        self.store = store
        self.modules = modules
        self.clock = clock
        self.refresh_ms = refresh_ms
        self.templates = Templates()

    def _subject(self, mod: PortalModule, node: str | None) -> dict[str, Any]:
        """What ``when`` reads besides the fixed parts: the node a panel shows."""
        subject: dict[str, Any] = {"self": mod.id}
        if node is not None:
            try:
                rows = self.store.host_query("nodes", mod.names, {"node_id": node}, Shaping(),
                                             now=self.clock())
            except Exception:  # the page still renders; node.* reads as unknown
                log.exception("reading node %s for a panel", node)
                rows = []
            row = rows[0] if rows else {}
            subject["node"] = {"id": node, "hostname": row.get("hostname"),
                               "online": bool(row.get("online")), "state": row.get("state")}
        return subject

    def page(self, module_name: str, kind: str, entry_id: str, *, node: str | None,
             as_json: bool, args: dict[str, str] | None = None) -> Response:
        mod = find_module(self.modules, module_name)
        if mod is None:
            return self.html_error(404, "Unknown module", f"no module {module_name!r} here")
        entry = mod.entry(kind, entry_id)
        if entry is None:
            return self.html_error(404, f"Unknown {kind}",
                                    f"{mod.id} has no {kind} {entry_id!r}")
        too_new = uicontract.notice(mod.id, mod.manifest.raw)
        if too_new is not None:  # requires.ui_contract leaves out 1.2: said, not drawn
            return self._contract_notice(mod, kind, entry, node, as_json, too_new)
        try:
            doc, problems = mod.read(kind, entry)
        except PageFileError as e:
            return self.html_error(500, f"Broken {kind}", str(e))
        now = self.clock()
        view = build_view(doc, RenderContext(fetch=services_fetch(self.store, mod, self.clock),
                                             node=node, now=now, resolve=link_resolver(mod),
                                             args=args, subject=self._subject(mod, node)))
        if as_json:
            return json_response(200, {"rendered_at": clock_text(now), "components": data_views(view)})
        if kind == "page":
            href = _page_href(mod.id, entry.id)
            subtitle = f"{mod.id} {mod.manifest.version}"
        else:
            href = _panel_href(node or "", mod.id, entry.id)
            subtitle = f"node {node} · {mod.id} {mod.manifest.version}"
        html = self.templates.render(
            "page.html", title=view["title"] or entry.title, subtitle=subtitle, view=view,
            kind=kind, problems=[str(p) for p in problems],
            refresh_url=href + "?" + urlencode(sorted({**(args or {}), "format": "json"}.items())),
            refresh_ms=self.refresh_ms, rendered_at=clock_text(now),
            crumbs=[mod.short_name, entry.title])
        return self._html(200, html)

    def _contract_notice(self, mod: PortalModule, kind: str, entry: UiEntry,
                         node: str | None, as_json: bool, text: str) -> Response:
        """The page of a module whose requires.ui_contract leaves this portal out."""
        now = self.clock()
        if as_json:
            return json_response(200, {"rendered_at": clock_text(now), "components": {},
                               "notice": text})
        subtitle = (f"{mod.id} {mod.manifest.version}" if kind == "page"
                    else f"node {node} · {mod.id} {mod.manifest.version}")
        html = self.templates.render(
            "page.html", title=entry.title, subtitle=subtitle, view={"body": []}, kind=kind,
            problems=[], notice=text, refresh_url=None, refresh_ms=self.refresh_ms,
            rendered_at=clock_text(now), crumbs=[mod.short_name, entry.title])
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
        listed, more = self.store.nodes(now=now, limit=INDEX_NODES)
        for n in listed:
            panels = []
            for name in n["modules"]:
                pm = find_module(self.modules, name)
                if pm is None:
                    continue  # reported, but this portal has no folder (no panels) for it
                for p in pm.manifest.panels:
                    panels.append({"title": f"{pm.short_name}: {p.title}",
                                   "href": _panel_href(n["node_id"], pm.id, p.id)})
            # "last report" is when this portal received it (the node's clock may be off)
            tone = "warn" if n["stale"] else "neutral" if n["agent_stopped"] else "ok"
            nodes.append(n | {"panels": panels, "reported_ago": ago_text(now - n["received_at"]),
                              "reported_iso": iso_text(n["received_at"]),
                              "liveness_tone": tone})
        html = self.templates.render("index.html", title="Modules and nodes", modules=modules,
                                     nodes=nodes, more_nodes=more is not None)
        return self._html(200, html)

    def static(self, name: str) -> Response:
        suffix = name[name.rfind("."):] if "." in name else ""
        if suffix not in _STATIC_TYPES or "/" in name or name.startswith("."):
            return error_response(404, f"no static file {name!r}")
        res = resources.files("oarbank_ui.pages").joinpath("static", name)
        if not res.is_file():
            return error_response(404, f"no static file {name!r}")
        return Response(200, res.read_bytes(), _STATIC_TYPES[suffix],
                        {"Cache-Control": "no-cache"})

    def _html(self, status: int, html: str) -> Response:
        return Response(status, html.encode(), "text/html; charset=utf-8",
                        {"Content-Security-Policy": _CSP, "Cache-Control": "no-store",
                         "X-Content-Type-Options": "nosniff"})

    def html_error(self, status: int, title: str, message: str) -> Response:
        return self._html(status, self.templates.render("error.html", title=title,
                                                        message=message))
