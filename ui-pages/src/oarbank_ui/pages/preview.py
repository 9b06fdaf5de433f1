"""``oarbank-portal preview``: a module's pages drawn from its fixtures, before any node exists.

Queries are answered from ``fixtures/ui/queries/<query>.json`` (a JSON list of rows, the same
shape ``GET /v1/queries/<query>`` returns, so a fixture can be captured from a live portal);
params filter rows by equality on the keys rows have (``since``/``until`` by the rows'
``t``), and the source's group_by/agg/order_by/limit shape them as the live portal does.
The result is static HTML in ``--out``:
``index.html``, ``page-<id>.html``, ``panel-<id>.html`` and ``static/``; open it in a browser.
Panels show the node given with ``--node`` (default: the first ``node_id`` in the fixtures).
A row value ``"-5m"`` (or ``"now"``) is a time relative to the preview (``queries/times.py``).
What the module uses that this project accepts without acting on (upstream's keys, sources and
components: ``oarbank_sdk.pages.module_notes``) is said once each on stderr
(``oarbank-portal: note: ...``); such components preview as placeholders that say why, even
where a fixture exists for an upstream query (this portal would never serve it).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

from oarbank_sdk.manifest import load
from oarbank_sdk.page_forms import Target
from oarbank_sdk.pages import module_notes

from ..queries.services import QueryError
from ..queries.times import resolve, resolve_rows
from .html import Templates, clock_text
from .modules import PageFileError, PortalModule
from .render import RenderContext, build_view

__all__ = ["fixture_fetch", "write_preview"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def fixture_fetch(bundle: Path, now: float | None = None
                  ) -> Callable[[str, dict[str, Any]], list[dict[str, Any]]]:
    """A query runner over ``<bundle>/fixtures/ui/queries/<query>.json``; relative times in
    rows (``"-5m"``) are read against ``now`` (default: the time of each fetch)."""

    def fetch(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", query):
            raise QueryError(f"bad query name {query!r}")
        rel = f"fixtures/ui/queries/{query}.json"
        try:
            rows = json.loads((bundle / rel).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise QueryError(f"no fixture {rel}")
        except (OSError, ValueError) as e:
            raise QueryError(f"{rel}: {e}")
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise QueryError(f"{rel}: expected a JSON list of row objects")
        at = time.time() if now is None else now
        rows = resolve_rows(rows, at)
        for k, v in params.items():
            if k in ("since", "until") and k not in (rows[0] if rows else {}):
                rows = _in_window(rows, k, v, at)
            else:
                rows = [r for r in rows if k not in r or r[k] == v]
        return rows  # the renderer shapes them (limit <= 200) as the live portal does

    return fetch


def _in_window(rows: list[dict[str, Any]], key: str, value: Any, now: float
               ) -> list[dict[str, Any]]:
    """``since``/``until`` (``node_metrics``' params) over rows' ``t``, as the store reads
    them."""
    bound = resolve(value, now)
    if isinstance(bound, bool) or not isinstance(bound, (int, float)):
        raise QueryError(f"{key} must be unix seconds or a relative time such as \"-1d\"")
    keep = (lambda t: t >= bound) if key == "since" else (lambda t: t <= bound)
    return [r for r in rows if not isinstance(r.get("t"), (int, float)) or keep(r["t"])]


def _first_node(bundle: Path) -> str | None:
    for f in sorted((bundle / "fixtures" / "ui" / "queries").glob("*.json")):
        try:
            rows = json.loads(f.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for r in rows if isinstance(rows, list) else []:
            if isinstance(r, dict) and isinstance(r.get("node_id"), str):
                return str(r["node_id"])
    return None


def _subject(fetch: Callable[[str, dict[str, Any]], list[dict[str, Any]]], mod: PortalModule,
             kind: str, node: str) -> dict[str, Any]:
    """What ``when`` reads: the previewed node (from ``nodes.json`` when there is one; a node
    without a fixture row is online, as a node being previewed would be)."""
    subject: dict[str, Any] = {"self": mod.id}
    if kind == "panel":
        try:
            rows = fetch("nodes", {"node_id": node})
        except QueryError:
            rows = []
        row = rows[0] if rows else {}
        subject["node"] = {"id": node, "hostname": row.get("hostname"),
                           "online": bool(row.get("online", True)), "state": row.get("state")}
    return subject


def _resolver(mod: PortalModule, node: str | None) -> Callable[[Target], str | None]:
    """Typed link targets in a preview: a page of the module -> its preview file, the previewed
    node -> its first panel's file; anything else has no file here (shown as text)."""

    def resolve(target: Target) -> str | None:
        if target.kind == "page" and mod.entry("page", target.value) is not None:
            return f"page-{_UNSAFE.sub('_', target.value)}.html"
        if target.kind == "node" and target.value == node and mod.manifest.panels:
            return f"panel-{_UNSAFE.sub('_', mod.manifest.panels[0].id)}.html"
        return None

    return resolve


def write_preview(module_dir: Path, out: Path, *, node: str | None = None) -> list[Path]:
    """Write the preview; returns the files written. Raises ``ManifestError``."""
    mod = PortalModule(load(module_dir))
    bundle = mod.manifest.bundle
    for n in module_notes(mod.manifest):
        print(f"oarbank-portal: note: {n}", file=sys.stderr)
    node = node or _first_node(bundle) or "preview-node"
    templates = Templates(static="static", home="index.html")
    out.mkdir(parents=True, exist_ok=True)
    static = out / "static"
    static.mkdir(exist_ok=True)
    for name in ("portal.css",):
        (static / name).write_bytes(resources.files("oarbank_ui.pages").joinpath("static", name)
                                    .read_bytes())
    written: list[Path] = []
    links = []
    now = time.time()
    for kind, entries in (("page", mod.manifest.pages), ("panel", mod.manifest.panels)):
        for entry in entries:
            target = out / f"{kind}-{_UNSAFE.sub('_', entry.id)}.html"
            try:
                doc, problems = mod.read(kind, entry)
            except PageFileError as e:
                print(f"oarbank-portal: {e}", file=sys.stderr)
                html = templates.render("error.html", title=entry.title, message=str(e))
            else:
                for p in problems:
                    print(f"oarbank-portal: warning: {p}", file=sys.stderr)
                fetch = fixture_fetch(bundle, now)
                view = build_view(doc, RenderContext(fetch=fetch,
                                                     node=node if kind == "panel" else None,
                                                     now=now, resolve=_resolver(mod, node),
                                                     subject=_subject(fetch, mod, kind, node)))
                subtitle = f"preview of {mod.id} {mod.manifest.version} from fixtures"
                if kind == "panel":
                    subtitle += f" · node {node}"
                html = templates.render(
                    "page.html", title=view["title"] or entry.title, subtitle=subtitle,
                    view=view, kind=kind, problems=[str(p) for p in problems], refresh_url=None,
                    refresh_ms=0, rendered_at=clock_text(now), crumbs=[mod.short_name])
            target.write_text(html, encoding="utf-8")
            written.append(target)
            links.append({"title": f"{kind}: {entry.title}", "href": target.name})
    index = templates.render("index.html", title=f"Preview of {mod.id}", nodes=[],
                             modules=[{"id": mod.id, "version": mod.manifest.version,
                                       "description": mod.manifest.description,
                                       "pages": links}])
    (out / "index.html").write_text(index, encoding="utf-8")
    written.insert(0, out / "index.html")
    shutil.rmtree(out / "static" / "__pycache__", ignore_errors=True)
    return written
