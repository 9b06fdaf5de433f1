"""What a module's pages name must exist: the query and the module's services.

A page whose source names a query the portal does not answer, or a ``service`` param that is
not one of the module's services, renders "data unavailable" or an empty table on every
portal: ``check`` and ``conform`` refuse it here instead. Queries: the host queries of the UI
contract (``HOST_QUERIES``); services: the manifest's ``[[services]]`` names. A param value
starting with ``$`` (``$node``) is the portal's to fill and is not checked.

Upstream's pages name more than this portal serves: a query of upstream's catalogue
(``page_forms.UPSTREAM_QUERIES``), a module view (``{"view": <id>}``, which must be declared
under ``[ui.views]``), an ``iframe`` (whose ``view`` must be declared under ``[[ui.iframes]]``),
components upstream's console draws (``page_forms.UPSTREAM_COMPONENTS``) and ``upload`` links.
Each is accepted with one note per name in the module (``reference_notes``), where it is first
used; a name neither this portal nor upstream's catalogue knows stays a problem.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .manifest.model import Manifest, Note, Problem
from .manifest.upstream import iframe_ids, view_ids
from .page_forms import HOST_QUERIES, NOT_SERVED, UPSTREAM_COMPONENTS, UPSTREAM_QUERIES, not_served

__all__ = ["HOST_QUERIES", "reference_notes", "reference_problems"]

_PLACEHOLDER = ": it previews as a placeholder saying so"


def _components(value: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every component object in a page, with its JSON path (the page itself first)."""
    if isinstance(value, dict):
        yield path, value
        for key in ("body", "children"):
            yield from _components(value.get(key), f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _components(item, f"{path}[{i}]")


def _sources(value: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ``source`` object in a page, with its JSON path."""
    for where, comp in _components(value, path):
        src = comp.get("source")
        if isinstance(src, dict):
            yield f"{where}.source", src


def _read(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # the page checks already said why it cannot be read


def reference_problems(manifest: Manifest, file: Path, shown: str) -> list[Problem]:
    """Sources in ``file`` (a page or panel of ``manifest``) naming what does not exist."""
    doc = _read(file)
    services = [s.name for s in manifest.services]
    views, frames = view_ids(manifest.raw), iframe_ids(manifest.raw)
    problems = []
    for path, comp in _components(doc, ""):
        frame = comp.get("view")
        if comp.get("type") == "iframe" and isinstance(frame, str) and frame not in frames:
            problems.append(Problem(f"{shown}: {path}.view", (
                f'no frame "{frame}": [[ui.iframes]] declares ' + (", ".join(frames) or "none"))))
    for path, src in _sources(doc, ""):
        query, view = src.get("query"), src.get("view")
        if isinstance(query, str) and query not in HOST_QUERIES + UPSTREAM_QUERIES:
            problems.append(Problem(f"{shown}: {path}.query", (
                f'no query "{query}": a portal answers {", ".join(HOST_QUERIES)} (upstream\'s '
                f'console also {", ".join(q for q in UPSTREAM_QUERIES if q not in HOST_QUERIES)})')))
        if query is None and isinstance(view, str) and view not in views:
            problems.append(Problem(f"{shown}: {path}.view", (
                f'no view "{view}": [ui.views] declares ' + (", ".join(views) or "none"))))
        params = src.get("params")
        service = params.get("service") if isinstance(params, dict) else None
        if isinstance(service, str) and not service.startswith("$") and service not in services:
            have = ", ".join(services) or "none"
            problems.append(Problem(f"{shown}: {path}.params.service", (
                f'the module has no service "{service}" (its services: {have}): the page '
                "would show nothing")))
    return problems


def reference_notes(manifest: Manifest, files: list[tuple[Path, str]]) -> list[Note]:
    """One note per source, component type and link kind of upstream's that the pages in
    ``files`` (``(path, shown name)``) use and this portal does not serve, at its first use."""
    seen: dict[str, list[str]] = {}  # what -> where, in page order
    why: dict[str, str] = {}
    for file, shown in files:
        for path, comp in _components(_read(file), ""):
            if not path:
                continue  # the page itself
            ctype = comp.get("type")
            if isinstance(ctype, str) and ctype in UPSTREAM_COMPONENTS:
                what = f'component "{ctype}"'
                why[what] = UPSTREAM_COMPONENTS[ctype] + _PLACEHOLDER
                seen.setdefault(what, []).append(f"{shown}: {path}")
            reason = not_served(comp.get("source"), HOST_QUERIES)
            if reason is not None:
                what = "source " + reason
                why[what] = NOT_SERVED + _PLACEHOLDER
                seen.setdefault(what, []).append(f"{shown}: {path}.source")
            to = comp.get("to")
            if ctype == "link" and isinstance(to, dict) and "upload" in to:
                why["link to upload"] = ("upstream's console opens its upload dialog; this "
                                         "portal has none: it previews as the link's text")
                seen.setdefault("link to upload", []).append(f"{shown}: {path}.to")
    notes = []
    for what, where in seen.items():
        more = f" (and {len(where) - 1} more)" if len(where) > 1 else ""
        notes.append(Note(where[0], f"accepted, not acted on: {what}{more}: {why[what]}"))
    return notes
