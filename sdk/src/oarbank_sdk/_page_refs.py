"""What a module's pages name must exist: the query and the module's services.

A page whose source names a query the portal does not answer, or a ``service`` param that is
not one of the module's services, renders "data unavailable" or an empty table on every
portal: ``check`` and ``conform`` refuse it here instead. Queries: the host queries of the UI
contract (``HOST_QUERIES``); services: the manifest's ``[[services]]`` names. A param value
starting with ``$`` (``$node``) is the portal's to fill and is not checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .manifest.model import Manifest, Problem

__all__ = ["HOST_QUERIES", "reference_problems"]

HOST_QUERIES = ("services",)  # every query a portal answers (UI contract 1.2)


def _sources(value: Any, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every ``source`` object in a page, with its JSON path."""
    if isinstance(value, dict):
        src = value.get("source")
        if isinstance(src, dict):
            yield f"{path}.source", src
        for key in ("body", "children"):
            yield from _sources(value.get(key), f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _sources(item, f"{path}[{i}]")


def reference_problems(manifest: Manifest, file: Path, shown: str) -> list[Problem]:
    """Sources in ``file`` (a page or panel of ``manifest``) naming what does not exist."""
    try:
        doc = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # the page checks already said why it cannot be read
    services = [s.name for s in manifest.services]
    problems = []
    for path, src in _sources(doc, ""):
        query = src.get("query")
        if isinstance(query, str) and query not in HOST_QUERIES:
            problems.append(Problem(f"{shown}: {path}.query", (
                f'no query "{query}": a portal answers {", ".join(HOST_QUERIES)}')))
        params = src.get("params")
        service = params.get("service") if isinstance(params, dict) else None
        if isinstance(service, str) and not service.startswith("$") and service not in services:
            have = ", ".join(services) or "none"
            problems.append(Problem(f"{shown}: {path}.params.service", (
                f'the module has no service "{service}" (its services: {have}): the page '
                "would show nothing")))
    return problems
