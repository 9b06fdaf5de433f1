"""The portal's requests, free of sockets: ``Portal.handle(method, path, query, body,
headers)`` returns a ``Response``. ``asgi.py`` puts it behind uvicorn (TCP or unix socket).

Every request: the Host header must be one this portal serves (``allowed_hosts``): a web page
on another origin cannot reach it through DNS rebinding. A heartbeat additionally: only
``application/json`` (a cross-site form or ``text/plain`` POST is refused before anything is
parsed), only with a node's token (``Authorization: Bearer``), only for the node the token
names (contract 6.2). ``admit`` makes the checks that need no body, so the server refuses an
unauthenticated caller before reading what it sends.

Routes:
  POST /v1/heartbeat                                   a node's report (contract section 6)
  GET  /v1/queries/services?module=M[&node_id=][&service=]   JSON list of rows (<= 200)
  GET  /v1/queries/nodes|node_metrics?module=M[&<param>=]...  the same, for those queries
  GET  /v1/queries/jobs|attempts?module=M[&<param>=]...       fleet dispatch's (contract 10.8)
  GET  /v1/nodes[?limit=N][&after=NODE_ID]             JSON list of nodes, paged (Link: next)
  POST|GET /v1/jobs..., /v1/batches..., POST /v1/agent/...   fleet dispatch (contract section
                                                       10; ``dispatch/http.py``)
  GET  /healthz                                        200 when the store answers, else 503
  GET  /metrics                                        Prometheus text format
  GET  /                                               index of modules and nodes
  GET  /modules/<module>/pages/<page id>[?format=json]
  GET  /nodes/<node id>/modules/<module>/panels/<panel id>[?format=json]
  GET  /static/<file>
``?format=json`` answers the page's data view: what the page's script redraws every few
seconds. ``<module>`` is a module id or its short name.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote, urlencode

from ..dispatch import queries as dispatch_queries
from ..dispatch.catalogue import Catalogue
from ..dispatch.http import DispatchAPI, Reply, is_dispatch_path, unavailable
from ..dispatch.store import DispatchStore
from ..pages.links import services_fetch
from ..pages.modules import PortalModule, find_module
from ..queries.services import MAX_ROWS, QueryError
from ..queries.shape import Shaping
from ..store.heartbeats import MAX_NODES_PAGE, HeartbeatStore
from ..store.tokens import bearer_token
from .hosts import HostCheck
from .page_routes import PageRoutes
from .prometheus import CONTENT_TYPE as METRICS_TYPE
from .prometheus import PortalMetrics
from .reports import CHALLENGE, STORE_FAILED, TOKEN_UNKNOWN, HeartbeatIngest
from .responses import Admission, Response, error_response, json_response

__all__ = ["MAX_BODY", "MAX_SUBMIT_BODY", "Portal", "reply_response", "route_name",
           "services_fetch"]

log = logging.getLogger("oarbank_ui.portal")
MAX_BODY = 1 << 20  # a heartbeat of a big node is a few tens of KiB
MAX_SUBMIT_BODY = 32 << 20  # POST /v1/jobs: up to 10,000 jobs (contract 10.2)
_REFUSAL_LOG_S = 60.0  # one line per cause a minute: a flood of bad posts is not a log flood


def route_name(path: str) -> str:
    """The ``route`` label of the latency histogram (a few fixed names, never the path)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if not parts:
        return "index"
    if parts[0] == "v1" and len(parts) >= 2:
        return {"heartbeat": "heartbeat", "nodes": "nodes", "queries": "services",
                "jobs": "jobs", "batches": "jobs", "agent": "agent"}.get(parts[1], "other")
    if parts[0] in ("healthz", "metrics", "static"):
        return parts[0]
    if parts[0] == "modules":
        return "page"
    if parts[0] == "nodes":
        return "panel"
    return "other"


def reply_response(r: Reply) -> Response:
    """A dispatch answer as the portal's ``Response``."""
    return json_response(r.status, r.doc, headers=dict(r.headers))


class _RefusalLog:
    """A warning for the first refusal of each cause, then one a minute with the count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[float, int]] = {}

    def __call__(self, cause: str, message: str) -> None:
        now = time.monotonic()
        with self._lock:
            last, skipped = self._last.get(cause, (-_REFUSAL_LOG_S, 0))
            if now - last < _REFUSAL_LOG_S:
                self._last[cause] = (last, skipped + 1)
                return
            self._last[cause] = (now, 0)
        more = f" ({skipped} more refused for this cause since the last line)" if skipped else ""
        log.warning("heartbeat refused (%s): %s%s", cause, message, more)


class Portal:
    def __init__(self, store: HeartbeatStore, modules: dict[str, PortalModule], *,
                 refresh_s: float = 3.0, clock: Callable[[], float] = time.time,
                 allowed_hosts: Sequence[str] | None = None,
                 dispatch: dict[str, Any] | None = None) -> None:
        self.store = store
        self.modules = modules
        self.refresh_ms = int(refresh_s * 1000)
        self.clock = clock
        # None: no Host check (in-process use); the server always passes its list.
        self.hosts = HostCheck(allowed_hosts) if allowed_hosts is not None else None
        jobs = DispatchStore(store.backend)
        self.metrics = PortalMetrics(lambda: self.store.summary(now=self.clock()),
                                     jobs.queue_depth)
        # fleet dispatch: the modules served here are the ones jobs may name
        self.dispatch = DispatchAPI(
            jobs, Catalogue.from_manifests(m.manifest for m in modules.values()),
            store.node_for_token, self.metrics, clock=clock, **(dispatch or {}))
        self.pages = PageRoutes(store, modules, clock, refresh_ms=self.refresh_ms)
        self._refusal_log = _RefusalLog()
        self._ingest: HeartbeatIngest | None = None
        self.ingest_options: dict[str, Any] = {}  # HeartbeatIngest's keywords (cli.py)

    def close(self) -> None:
        """The group commit writes what it holds and stops, then the store's connections
        close (SQLite: the last one folds the WAL back into the database file)."""
        if self._ingest is not None:
            self._ingest.close()
        self.dispatch.close()
        self.store.close()

    @property
    def ingest(self) -> HeartbeatIngest:
        """The heartbeat path past its headers (made on first use, in the serving process)."""
        if self._ingest is None:
            self._ingest = HeartbeatIngest(self.store, self.metrics, self.refuse,
                                           self.check_token, self.clock, **self.ingest_options)
        return self._ingest

    # -- dispatch --------------------------------------------------------------------------

    def refuse(self, cause: str, status: int, message: str,
               headers: dict[str, str] | None = None) -> Response:
        """A refused report: counted by cause, logged (rate-limited), answered with why."""
        self.metrics.refused.labels(cause).inc()
        self._refusal_log(cause, message)
        r = error_response(status, message)
        r.headers.update(headers or {})
        return r

    def admit(self, method: str, path: str, headers: Mapping[str, str], *,
              lookup: bool = True) -> Admission | Response:
        """The checks a request passes before its body is read: Host for every request; for a
        heartbeat also its content type and its token (``lookup=False``: only that there is
        one, without asking the store). ``headers``: lower-case names."""
        if self.hosts is not None:
            host = headers.get("host")
            if not self.hosts.allows(host):
                if path.rstrip("/") == "/v1/heartbeat":  # a report refused: counted, logged
                    return self.refuse("host", 400, self.hosts.refusal(host))
                return error_response(400, self.hosts.refusal(host))
        if path.rstrip("/") != "/v1/heartbeat" or method != "POST":
            return Admission("", headers)
        ctype = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            return self.refuse("content_type", 415, "heartbeat: Content-Type must be "
                               f"application/json, got {ctype or 'none'}")
        token = bearer_token(headers.get("authorization"))
        if token is None:
            return self.refuse("unauthenticated", 401, "heartbeat: no node credential "
                               "(Authorization: Bearer <token>; the portal's operator issues "
                               "one with `oarbank-portal token issue NODE_ID`)", CHALLENGE)
        if not lookup:
            return Admission("")
        return self.check_token(token)

    def check_token(self, token: str) -> Admission | Response:
        """The node ``token`` names, asked of the store, or the refusal."""
        try:
            node = self.store.node_for_token(token)
        except Exception:  # the store is away: the agent retries a 5xx, not a 4xx
            log.exception("heartbeat: looking up the token failed")
            return self.refuse("store_error", 503, "heartbeat: the portal could not check the "
                               "token (see the portal's log); send it again")
        if node is None:
            return self.refuse("unauthenticated", 401, TOKEN_UNKNOWN, CHALLENGE)
        return Admission(node)

    def handle(self, method: str, path: str, query: dict[str, list[str]],
               body: bytes = b"", headers: Mapping[str, str] | None = None,
               admitted: Admission | None = None, timed: bool = True) -> Response:
        """Answer one request. ``admitted``: what ``admit`` returned, when the caller called
        it already; otherwise it is called here. ``timed=False``: the server times the whole
        request itself (from its head, body read included)."""
        started = time.perf_counter()
        route = route_name(path)
        timed_here = timed
        try:
            stack = contextlib.ExitStack()
            try:
                stack.enter_context(self.store.session())
            except Exception as e:  # no connection to be had: the store is down
                return self._store_down(route, e)
            with stack:
                return self._handle(method, path, query, body, headers, admitted)
        finally:
            if timed_here:
                self.metrics.observe(route, started)

    def body_limit(self, path: str) -> int:
        """The largest body a request to ``path`` may send (its Content-Length)."""
        return MAX_SUBMIT_BODY if path.rstrip("/") == "/v1/jobs" else MAX_BODY

    def _store_down(self, route: str, e: Exception) -> Response:
        log.warning("the store does not answer: %s: %s", type(e).__name__, e)
        if route in ("jobs", "agent"):
            return reply_response(unavailable())
        if route == "heartbeat":  # a 5xx: the agent sends it again
            return self.refuse("store_error", 503, STORE_FAILED)
        if route == "healthz":
            return json_response(503, {"ok": False, "store": self.store.kind,
                               "error": f"{type(e).__name__}: {e}"})
        return error_response(503, "the portal's store does not answer; see the portal's log")

    def _handle(self, method: str, path: str, query: dict[str, list[str]], body: bytes,
                headers: Mapping[str, str] | None, admitted: Admission | None) -> Response:
        if admitted is None:
            checked = self.admit(method, path, {k.lower(): v for k, v in (headers or {}).items()})
            if isinstance(checked, Response):
                return checked
            admitted = checked
        return self._dispatch(method, path, query, body, admitted)[1]

    def _dispatch(self, method: str, path: str, query: dict[str, list[str]], body: bytes,
                  admitted: Admission) -> tuple[str, Response]:
        parts = [unquote(p) for p in path.split("/") if p]
        route = "other"
        if is_dispatch_path(parts):
            route = route_name(path)
            try:
                return route, reply_response(self.dispatch.handle(
                    method, parts, query, body, admitted.headers))
            except Exception:  # a bug must cost one request, not the portal
                log.exception("error answering %s %s", method, path)
                return route, error_response(500, "internal error; see the portal's log")
        try:
            if parts == ["v1", "heartbeat"]:
                route = "heartbeat"
                if method != "POST":
                    return route, error_response(405, "POST a heartbeat here")
                return route, self.heartbeat(body, admitted.node_id)
            if method not in ("GET", "HEAD"):
                return route, error_response(405, f"{method} is not allowed on {path}")
            if not parts:
                return "index", self.pages.index()
            if parts == ["v1", "queries", "services"]:
                return "services", self.services_query(query)
            if parts in (["v1", "queries", "nodes"], ["v1", "queries", "node_metrics"]):
                return "services", self.host_query(parts[2], query)
            if parts in (["v1", "queries", "jobs"], ["v1", "queries", "attempts"]):
                return "services", self.dispatch_query(parts[2], query)
            if parts == ["favicon.ico"]:
                return route, Response(204, b"", "image/x-icon")  # browsers ask; nothing to show
            if parts == ["v1", "nodes"]:
                return "nodes", self.nodes(query)
            if parts == ["healthz"]:
                return "healthz", self.healthz()
            if parts == ["metrics"]:
                return "metrics", Response(200, self.metrics.render(), METRICS_TYPE)
            if len(parts) == 2 and parts[0] == "static":
                return "static", self.pages.static(parts[1])
            as_json = query.get("format") == ["json"]
            # table paging and sorting: "<table>.page" and the like, one value each
            args = {k: v[0][:200] for k, v in query.items()
                    if k != "format" and len(v) == 1 and len(k) <= 80}
            if len(parts) == 4 and parts[0] == "modules" and parts[2] == "pages":
                return "page", self.pages.page(parts[1], "page", parts[3], node=None, as_json=as_json,
                                         args=args)
            if (len(parts) == 6 and parts[0] == "nodes" and parts[2] == "modules"
                    and parts[4] == "panels"):
                return "panel", self.pages.page(parts[3], "panel", parts[5], node=parts[1],
                                          as_json=as_json, args=args)
        except Exception:  # a bug or a store outage must cost one request, not the portal
            log.exception("error answering %s %s", method, path)
            if route == "heartbeat":
                return route, self.refuse("store_error", 503, STORE_FAILED)
            return route, error_response(500, "internal error; see the portal's log")
        return route, self.pages.html_error(404, "Not found", f"nothing at {path}")

    # -- heartbeats and queries ------------------------------------------------------------

    def heartbeat(self, body: bytes, node_id: str) -> Response:
        """A report from the node ``node_id`` (its token's), stored in its own transaction
        (in-process callers; the server queues reports for group commit: reports.py)."""
        report = self.ingest.prepare(body, node_id, None)
        if isinstance(report, Response):
            return report
        return self.ingest.answer(report, self.ingest.record_now(report))

    def healthz(self) -> Response:
        try:
            health = self.store.health()
        except Exception as e:  # the store is down: say so, with its reason
            log.warning("healthz: the store does not answer: %s", e)
            return json_response(503, {"ok": False, "store": self.store.kind,
                               "error": f"{type(e).__name__}: {e}"})
        return json_response(200, {"ok": True} | health)

    def nodes(self, query: dict[str, list[str]]) -> Response:
        for k, v in query.items():
            if k not in ("limit", "after"):
                return error_response(400, f"nodes: unknown parameter {k!r} (limit, after)")
            if len(v) != 1:
                return error_response(400, f"nodes: parameter {k} given {len(v)} times")
        text = query.get("limit", [str(MAX_NODES_PAGE)])[0]
        if not text.isdigit() or not 1 <= int(text) <= MAX_NODES_PAGE:
            return error_response(400, f"nodes: limit must be a whole number 1..{MAX_NODES_PAGE}, "
                               f"got {text!r}")
        limit = int(text)
        after = query.get("after", [None])[0]
        page, nxt = self.store.nodes(now=self.clock(), limit=limit, after=after)
        resp = json_response(200, page)
        if nxt is not None:  # the body stays a plain list; the next page is in the headers
            link = "/v1/nodes?" + urlencode({"limit": limit, "after": nxt})
            resp.headers["Link"] = f'<{link}>; rel="next"'
            resp.headers["X-Oarbank-Next-After"] = quote(nxt, safe="")
        return resp

    def services_query(self, query: dict[str, list[str]]) -> Response:
        for k, v in query.items():
            if k not in ("module", "node_id", "service"):
                return error_response(400, f"services: unknown parameter {k!r} "
                                   "(module, node_id, service)")
            if len(v) != 1:
                return error_response(400, f"services: parameter {k} given {len(v)} times")
        if "module" not in query or not query["module"][0]:
            return error_response(400, "services: the module parameter is required")
        name = query["module"][0]
        mod = find_module(self.modules, name)
        # A module this portal has no folder for is still answered from what nodes report.
        names = mod.names if mod else (name,)
        rows, cut = self.store.services_page(names, node_id=query.get("node_id", [None])[0],
                                             service=query.get("service", [None])[0],
                                             limit=MAX_ROWS, now=self.clock())
        resp = json_response(200, rows)
        if cut:  # the body stays a plain list of rows (the fixture shape); the cut is said here
            resp.headers["X-Oarbank-Rows-Truncated"] = f"first {MAX_ROWS} rows; filter by node_id or service"
        return resp

    def host_query(self, name: str, query: dict[str, list[str]]) -> Response:
        """``nodes`` / ``node_metrics`` rows (at most 200; the fixture shape): ``module`` and
        the query's params, one value each (``online`` as true/false)."""
        if any(len(v) != 1 for v in query.values()):
            return error_response(400, f"{name}: each parameter once")
        params: dict[str, Any] = {k: v[0] for k, v in query.items() if k != "module"}
        module = query.get("module", [""])[0]
        if not module:
            return error_response(400, f"{name}: the module parameter is required")
        if "online" in params:
            params["online"] = {"true": True, "false": False}.get(params["online"],
                                                                  params["online"])
        mod = find_module(self.modules, module)
        try:
            rows = self.store.host_query(name, mod.names if mod else (module,), params,
                                         Shaping(), now=self.clock())
        except QueryError as e:
            return error_response(400, str(e))
        return json_response(200, rows)

    def dispatch_query(self, name: str, query: dict[str, list[str]]) -> Response:
        """``jobs`` / ``attempts`` rows of a module (at most 200, newest first; contract
        10.8): ``module`` and the query's params, one value each."""
        if any(len(v) != 1 for v in query.values()):
            return error_response(400, f"{name}: each parameter once")
        module = query.get("module", [""])[0]
        if not module:
            return error_response(400, f"{name}: the module parameter is required")
        mod = find_module(self.modules, module)
        params = {k: v[0] for k, v in query.items() if k != "module"}
        try:
            rows = dispatch_queries.host_query(self.dispatch.store.backend, name,
                                               [mod.id if mod else module], params, MAX_ROWS)
        except QueryError as e:
            return error_response(400, str(e))
        return json_response(200, rows)
