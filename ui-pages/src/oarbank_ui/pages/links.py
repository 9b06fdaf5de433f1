"""What a module's pages reach on the live portal: the query runner (``services``,
``nodes``, ``node_metrics``, each filtered to the module) and where typed link targets go."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from oarbank_sdk.page_forms import Target

from ..dispatch import queries as dispatch_queries
from ..queries.services import MAX_ROWS, QueryError
from ..queries.shape import Shaping, shape_rows
from ..store.heartbeats import ALL_ROWS, HeartbeatStore
from .modules import PortalModule
from .render import PORTAL_QUERIES

__all__ = ["link_resolver", "services_fetch"]


def _page_href(module_id: str, page_id: str) -> str:
    return f"/modules/{quote(module_id, safe='')}/pages/{quote(page_id, safe='')}"


def _panel_href(node_id: str, module_id: str, panel_id: str) -> str:
    return (f"/nodes/{quote(node_id, safe='')}/modules/{quote(module_id, safe='')}"
            f"/panels/{quote(panel_id, safe='')}")


def services_fetch(store: HeartbeatStore, module: PortalModule,
                   now: Callable[[], float] = time.time) -> Callable[..., Any]:
    """The query runner a module's pages use: ``services`` (``node_id``/``service``, shaped
    here), ``nodes``/``node_metrics`` (``queries/nodes.py``: shaped by the store) and fleet
    dispatch's ``jobs``/``attempts`` (``dispatch/store.py``), every one filtered to the module's
    rows. ``fetch.shaped(query, params, shaping)`` is what the
    renderer calls."""

    def fetch(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return shaped(query, params, Shaping())

    def shaped(query: str, params: dict[str, Any], shaping: Shaping) -> list[dict[str, Any]]:
        if query in ("nodes", "node_metrics"):
            return store.host_query(query, module.names, params, shaping, now=now())
        if query in ("jobs", "attempts"):  # fleet dispatch's (contract 10.8)
            rows = dispatch_queries.host_query(
                store.backend, query, [module.id], params, ALL_ROWS if shaping.agg else MAX_ROWS)
            return shape_rows(rows, shaping)
        if query != "services":
            raise QueryError(f"unknown query {query!r} (this portal answers: "
                             f"{', '.join(PORTAL_QUERIES)})")
        for k, v in params.items():
            if k not in ("node_id", "service"):
                raise QueryError(f"services: unknown parameter {k!r} (node_id, service)")
            if not isinstance(v, str):
                raise QueryError(f"services: parameter {k} must be a string")
        # aggregates read every row of the module: a count must not stop at 200 rows
        rows = store.services(module.names, node_id=params.get("node_id"),
                              service=params.get("service"), now=now(),
                              limit=ALL_ROWS if shaping.agg else MAX_ROWS)
        return shape_rows(rows, shaping)

    fetch.shaped = shaped  # type: ignore[attr-defined]
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
