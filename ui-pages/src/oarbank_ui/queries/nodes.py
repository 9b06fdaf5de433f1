"""The ``nodes`` and ``node_metrics`` host queries, over what heartbeats already say, and the
bounded history behind ``node_metrics`` (SQLite and PostgreSQL alike).

History: every stored report adds to one sample per node, module, service and time bucket
(``node_samples``): ``fine_s`` wide (default 5 min) while it is young, holding the bucket's
latest state, its highest users, resident memory and node memory. Samples older than
``fine_keep_s`` (default 6 h) are rolled up into ``coarse_s`` buckets (default 1 h; a coarse
bucket was ``ready`` if the service was ready in any of its samples), and samples older than
``retention_s`` (default 7 days, ``oarbank-portal serve --metrics-retention-h``) are deleted.
So a node costs at most ``fine_keep_s / fine_s + retention_s / coarse_s`` samples per service
(72 + 168 with the defaults) whatever its heartbeat period. The roll-up runs at most once a
``compact_every_s`` per process, inside a report's write, and is idempotent (each coarse
bucket is rolled once, when all of it is older than ``fine_keep_s``): replicas may race.

Queries (each filtered to the module's rows, then shaped like every source:
``shape.py``; ``limit`` <= 200):

- ``nodes``: one row per node reporting the module: ``node_id``, ``hostname``, ``online``
  (reporting and not stale), ``liveness``, ``state`` (its best service: ``ready``,
  ``starting``, ``stopped``; ``unknown`` when stale), ``services``, ``ready``, ``users``,
  ``rss_bytes`` (the module's services), the node's ``mem_used_bytes``,
  ``mem_reserved_bytes``, ``mem_total_bytes``, ``gpu_mem_used_bytes``,
  ``gpu_mem_total_bytes``, ``reported_at``. Params: ``node_id``, ``hostname``, ``state``,
  ``online``.
- ``node_metrics``: one row per sample: ``node_id``, ``hostname``, ``service``, ``t`` (the
  bucket's start, unix seconds), ``res_s``, ``state``, ``running``, ``ready`` (0/1),
  ``users``, ``rss_bytes``, ``loads``, ``mem_used_bytes``, ``mem_reserved_bytes``,
  ``gpu_mem_used_bytes``, ``samples``. Params: ``node_id``, ``service``, ``state``, and
  ``since`` / ``until`` (``"-1d"``, ``"-6h"``, ``"now"`` or unix seconds; ``since`` defaults
  to a day ago). ``group_by`` + ``agg`` (count, sum, mean, min, max) run in SQL, so a chart
  of the whole fleet reads one row per bucket, not one per sample; ``median`` and ``p95``
  are computed here over at most ``MAX_SCAN`` samples. Without ``order_by`` rows come in
  time order. Grouped by ``t``, buckets that can no longer change are answered from
  ``bucket_cache.py`` (per process) and only the others are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ingest.validate import Heartbeat, service_metrics
from .bucket_cache import BucketCache
from .services import QueryError, derive_state, iso_utc
from .shape import Shaping, shape_rows
from .times import resolve

__all__ = ["MAX_SCAN", "History", "NODES_PARAMS", "METRICS_PARAMS", "SAMPLE_INSERT", "compact",
           "node_metrics", "nodes_query", "record_samples", "sample_conflict", "sample_values"]

MAX_SCAN = 100_000
NODES_PARAMS = ("node_id", "hostname", "state", "online")
METRICS_PARAMS = ("node_id", "service", "state", "since", "until")
_SAMPLE_COLUMNS = ("node_id", "hostname", "service", "t", "res_s", "running", "ready", "users",
                   "rss_bytes", "loads", "mem_used_bytes", "mem_reserved_bytes",
                   "gpu_mem_used_bytes", "samples")
METRICS_FIELDS = (*_SAMPLE_COLUMNS, "state")
_SQL_AGGS = {"count": "COUNT", "sum": "SUM", "mean": "AVG", "min": "MIN", "max": "MAX"}


@dataclass(frozen=True)
class History:
    """How much history the portal keeps, and how finely."""

    fine_s: int = 300
    fine_keep_s: int = 6 * 3600
    coarse_s: int = 3600
    retention_s: int = 7 * 86400
    compact_every_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.fine_s <= self.coarse_s or self.coarse_s % self.fine_s:
            raise ValueError("history: coarse_s must be a multiple of fine_s")
        if self.retention_s < self.coarse_s:
            raise ValueError(f"history: retention must be at least {self.coarse_s} s")


def _floor(kind: str, expr: str, size: int) -> str:
    if kind == "sqlite":
        return f"(CAST(({expr}) / {size} AS INTEGER) * {size})"
    return f"(floor(({expr}) / {size}) * {size})"


def _greatest(kind: str, a: str, b: str) -> str:
    return f"max({a}, {b})" if kind == "sqlite" else f"GREATEST({a}, {b})"


SAMPLE_INSERT = ("INSERT INTO node_samples (module, node_id, service, res_s, t, hostname,"
                  " running, ready, users, rss_bytes, loads, mem_used_bytes,"
                  " mem_reserved_bytes, gpu_mem_used_bytes, samples)")


def sample_conflict(kind: str) -> str:
    """How a sample folds into its bucket's: the latest state, the highest figures."""
    g = lambda c: _greatest(kind, f"node_samples.{c}", f"excluded.{c}")  # noqa: E731
    return (" ON CONFLICT (module, node_id, service, res_s, t) DO UPDATE SET"
            " hostname = excluded.hostname, running = excluded.running,"
            f" ready = excluded.ready, users = {g('users')},"
            f" rss_bytes = COALESCE({g('rss_bytes')}, excluded.rss_bytes),"
            " loads = excluded.loads,"
            f" mem_used_bytes = COALESCE({g('mem_used_bytes')}, excluded.mem_used_bytes),"
            " mem_reserved_bytes = excluded.mem_reserved_bytes,"
            f" gpu_mem_used_bytes = COALESCE({g('gpu_mem_used_bytes')},"
            " excluded.gpu_mem_used_bytes), samples = node_samples.samples + 1")


def record_samples(tx: Any, kind: str, hb: Heartbeat, now: float, h: History) -> None:
    """Fold one stored report into its fine buckets (inside the report's transaction)."""
    if not hb.services:
        return
    sql = (SAMPLE_INSERT + " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1)"
           + sample_conflict(kind))
    tx.many(sql, sample_values(hb, now, h))


def sample_values(hb: Heartbeat, now: float, h: History) -> list[tuple[Any, ...]]:
    """A report's samples for its fine bucket: SAMPLE_INSERT's values but ``samples`` (1)."""
    bucket = float(int(now // h.fine_s) * h.fine_s)
    m = hb.metrics or {}
    stopped = hb.agent_stopped
    return [
        (r.module, hb.node_id, r.service, h.fine_s, bucket, hb.hostname,
         int(r.running and not stopped), int(r.ready and r.running and not stopped),
         0 if stopped else r.users, *service_metrics(r).values(), m.get("mem_used_bytes"),
         m.get("mem_reserved_bytes"), m.get("gpu_mem_used_bytes"))
        for r in hb.services]


def compact(tx: Any, kind: str, now: float, h: History,
            modules: list[str] | None = None) -> dict[str, int]:
    """Roll fine samples whose coarse bucket has aged past ``fine_keep_s`` into it, and drop
    samples past ``retention_s``. Counts of what went.

    ``modules`` (the ones this process has seen reported; None: every module, read from the
    table) bound the work to index ranges: with them only the last two hours before the edge
    are rolled (what aged since the previous run, once a minute), without them everything
    before it (a process's first run, after a portal was down for a while)."""
    edge = float(int((now - h.fine_keep_s) // h.coarse_s) * h.coarse_s)
    full = modules is None
    if modules is None:
        modules = [r["module"] for r in tx.all("SELECT DISTINCT module FROM node_samples")]
    low = -1.0 if full else edge - 2 * h.coarse_s
    ct = _floor(kind, "t", h.coarse_s)
    rolled = dropped = 0
    for module in modules:  # each a range of the (module, t, ...) index
        args = (module, low, edge, h.fine_s)
        tx.run("INSERT INTO node_samples (module, node_id, service, res_s, t, hostname,"
               " running, ready, users, rss_bytes, loads, mem_used_bytes, mem_reserved_bytes,"
               " gpu_mem_used_bytes, samples)"
               f" SELECT module, node_id, service, {h.coarse_s}, {ct}, MAX(hostname),"
               " MAX(running), MAX(ready), MAX(users), MAX(rss_bytes), MAX(loads),"
               " MAX(mem_used_bytes), MAX(mem_reserved_bytes), MAX(gpu_mem_used_bytes),"
               " SUM(samples) FROM node_samples WHERE module = ? AND t >= ? AND t < ?"
               f" AND res_s = ? GROUP BY module, node_id, service, {ct}"
               " ON CONFLICT (module, node_id, service, res_s, t) DO NOTHING", args)
        rolled += tx.run("DELETE FROM node_samples WHERE module = ? AND t >= ? AND t < ?"
                         " AND res_s = ?", args)
        dropped += tx.run("DELETE FROM node_samples WHERE module = ? AND t < ?",
                          (module, now - h.retention_s))
    return {"rolled": rolled, "dropped": dropped}


def _when(v: Any, now: float, name: str) -> float:
    t = resolve(v, now)
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise QueryError(f"node_metrics: {name} must be unix seconds or a relative time such "
                         f"as \"-1d\", got {v!r}")
    return float(t)


def _check_params(query: str, params: dict[str, Any], known: tuple[str, ...]) -> None:
    for k, v in params.items():
        if k not in known:
            raise QueryError(f"{query}: unknown parameter {k!r} ({', '.join(known)})")
        if k == "online":
            if not isinstance(v, bool):
                raise QueryError(f"{query}: parameter online must be true or false")
        elif k not in ("since", "until") and not isinstance(v, str):
            raise QueryError(f"{query}: parameter {k} must be a string")


def _in(names: list[str]) -> str:
    return ", ".join("?" * len(names))


NODE_FIELDS = ("node_id", "hostname", "online", "liveness", "state", "services", "ready",
               "users", "rss_bytes", "mem_used_bytes", "mem_reserved_bytes", "mem_total_bytes",
               "gpu_mem_used_bytes", "gpu_mem_total_bytes", "reported_at")
_NODE_MEM = ("mem_used_bytes", "mem_reserved_bytes", "mem_total_bytes", "gpu_mem_used_bytes",
             "gpu_mem_total_bytes")


def _nodes_sql(names: list[str], params: dict[str, Any], now: float) -> tuple[str, list[Any]]:
    """One row per node of the module, state and liveness decided in SQL (as
    ``services.py`` decides them) so filters and aggregates never load the whole fleet."""
    stale = "n.received_at < ? - 3 * n.heartbeat_s"
    sql = ("SELECT n.node_id AS node_id, n.hostname AS hostname, n.reported_at AS reported_at,"
           " n.received_at AS received_at, n.agent_stopped AS agent_stopped,"
           + "".join(f" n.{c} AS {c}," for c in _NODE_MEM) +
           " COUNT(*) AS services, SUM(s.running * s.ready) AS ready,"
           " CASE WHEN n.agent_stopped = 1 THEN 0 ELSE SUM(s.users) END AS users,"
           " SUM(s.rss_bytes) AS rss_bytes,"
           f" CASE WHEN n.agent_stopped = 1 THEN 'stopped' WHEN {stale} THEN 'unknown'"
           " WHEN SUM(s.running * s.ready) > 0 THEN 'ready' WHEN SUM(s.running) > 0"
           " THEN 'starting' ELSE 'stopped' END AS state,"
           f" CASE WHEN n.agent_stopped = 0 AND NOT ({stale}) THEN 1 ELSE 0 END AS online"
           " FROM service_rows s JOIN nodes n ON n.node_id = s.node_id"
           f" WHERE s.module IN ({_in(names)})")
    args: list[Any] = [now, now, *names]
    for k in ("node_id", "hostname"):
        if k in params:
            sql += f" AND n.{k} = ?"
            args.append(params[k])
    sql += (" GROUP BY n.node_id, n.hostname, n.reported_at, n.received_at, n.heartbeat_s,"
            " n.agent_stopped" + "".join(f", n.{c}" for c in _NODE_MEM))
    outer = f"FROM ({sql}) x WHERE 1 = 1"
    if "state" in params:
        outer += " AND state = ?"
        args.append(params["state"])
    if "online" in params:
        outer += " AND online = ?"
        args.append(int(params["online"]))
    return outer, args


def _node_row(r: dict[str, Any]) -> dict[str, Any]:
    stopped, online = bool(r["agent_stopped"]), bool(r["online"])
    liveness = ("agent stopped" if stopped else "reporting" if online
                else f"not reporting (last report {iso_utc(r['received_at'])})")
    out = {k: r[k] for k in NODE_FIELDS if k not in ("liveness", "online")}
    for k in ("services", "ready", "users"):
        out[k] = int(out[k] or 0)
    if out["rss_bytes"] is not None:
        out["rss_bytes"] = int(out["rss_bytes"])
    return {"node_id": out.pop("node_id"), "hostname": out.pop("hostname"), "online": online,
            "liveness": liveness, **out}


def _order(col: str, descending: bool) -> str:
    """Nulls last either way, as ``shape_rows`` sorts (SQLite and PostgreSQL differ)."""
    return f"({col} IS NULL), {col} {'DESC' if descending else 'ASC'}"


def nodes_query(tx: Any, names: list[str], params: dict[str, Any], shaping: Shaping,
                now: float) -> list[dict[str, Any]]:
    _check_params("nodes", params, NODES_PARAMS)
    for f in (shaping.group_by, shaping.order_by, *shaping.agg):
        if f is not None and f not in NODE_FIELDS:
            raise QueryError(f"nodes: no field {f!r} ({', '.join(NODE_FIELDS)})")
    outer, args = _nodes_sql(names, params, now)
    in_sql = all(fn in _SQL_AGGS for fn in shaping.agg.values()) and "liveness" not in (
        shaping.group_by, *shaping.agg)
    if shaping.agg and in_sql:
        cols = ", ".join(f"{_SQL_AGGS[fn]}({f}) AS {f}" for f, fn in shaping.agg.items())
        if shaping.group_by is not None:
            g = shaping.group_by
            got = tx.all(f"SELECT {g} AS g, {cols} {outer} GROUP BY {g} ORDER BY {g}", args)
        else:
            got = tx.all(f"SELECT {cols} {outer}", args)
        out = []
        for r in got:
            row: dict[str, Any] = {}
            if shaping.group_by is not None:
                row[shaping.group_by] = bool(r["g"]) if shaping.group_by == "online" else r["g"]
            for f, fn in shaping.agg.items():
                v = r[f]
                row[f] = int(v or 0) if fn == "count" else (
                    float(v) if v is not None and not isinstance(v, (int, float)) else v)
            out.append(row)
        return shape_rows(out, Shaping(fields=shaping.fields, order_by=shaping.order_by,
                                       descending=shaping.descending, limit=shaping.limit))
    if shaping.agg or shaping.order_by == "liveness":  # median, p95: over the fleet, here
        rows = [_node_row(r) for r in tx.all(f"SELECT * {outer} ORDER BY node_id", args)]
        return shape_rows(rows, shaping)
    order = "node_id" if shaping.order_by is None else (
        _order(shaping.order_by, shaping.descending) + ", node_id")
    rows = tx.all(f"SELECT * {outer} ORDER BY {order} LIMIT ?", [*args, shaping.limit])
    return shape_rows([_node_row(r) for r in rows], Shaping(fields=shaping.fields,
                                                            limit=shaping.limit))


def _state(running: Any, ready: Any) -> str:
    return derive_state(bool(running), bool(ready))


def _metric_row(r: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {k: r.get(k) for k in _SAMPLE_COLUMNS}
    out["t"] = float(r["t"])
    out["state"] = _state(r["running"], r["ready"])
    for k in ("running", "ready", "users", "res_s", "samples"):
        out[k] = int(out[k]) if out[k] is not None else None
    return out


def node_metrics(tx: Any, names: list[str], params: dict[str, Any], shaping: Shaping,
                 now: float, cache: BucketCache | None = None) -> list[dict[str, Any]]:
    _check_params("node_metrics", params, METRICS_PARAMS)
    since = _when(params.get("since", "-1d"), now, "since")
    cond = f"module IN ({_in(names)})"
    args: list[Any] = [*names]
    for k in ("node_id", "service"):
        if k in params:
            cond += f" AND {k} = ?"
            args.append(params[k])
    state = params.get("state")
    if state is not None:
        sc = {"ready": "running = 1 AND ready = 1", "starting": "running = 1 AND ready = 0",
              "stopped": "running = 0"}.get(state)
        if sc is None:
            raise QueryError("node_metrics: state must be ready, starting or stopped")
        cond += f" AND {sc}"
    for f in (shaping.group_by, shaping.order_by, *shaping.agg):
        if f is not None and f not in METRICS_FIELDS:
            raise QueryError(f"node_metrics: no field {f!r} ({', '.join(METRICS_FIELDS)})")
    until = _when(params["until"], now, "until") if "until" in params else None
    where, wargs = cond + " AND t >= ?", [*args, since]
    if until is not None:
        where += " AND t <= ?"
        wargs.append(until)
    if shaping.agg and all(fn in _SQL_AGGS for fn in shaping.agg.values()) \
            and shaping.group_by != "state" and "state" not in shaping.agg:
        if shaping.group_by == "t" and until is None and cache is not None:
            key = (tuple(names), tuple(sorted((k, str(v)) for k, v in params.items()
                                              if k != "since")), tuple(shaping.agg.items()))

            def fetch(windows: list[tuple[float, float]]) -> list[dict[str, Any]]:
                out: list[dict[str, Any]] = []
                for lo, hi in windows:  # a plain range each: the index serves it
                    out += _grouped_rows(tx, f"{cond} AND t >= ? AND t < ?",
                                         [*args, lo, min(hi, 1e18)], shaping)
                return out

            rows = cache.answer(key, since, now, fetch)
            return shape_rows(rows, Shaping(fields=shaping.fields, order_by=shaping.order_by,
                                            descending=shaping.descending, limit=shaping.limit))
        return _grouped_in_sql(tx, where, wargs, shaping)
    order = "t, node_id, service"
    if shaping.order_by is not None and not shaping.agg:
        col = shaping.order_by if shaping.order_by != "state" else "running * 2 + ready"
        order = f"{_order(col, shaping.descending)}, node_id, service, t"
    cap = shaping.limit if not shaping.agg else MAX_SCAN + 1
    rows = tx.all(f"SELECT {', '.join(_SAMPLE_COLUMNS)} FROM node_samples WHERE {where}"
                  f" ORDER BY {order} LIMIT ?", [*wargs, cap])
    if len(rows) > MAX_SCAN:
        raise QueryError(f"node_metrics: median or p95 over more than {MAX_SCAN} samples; "
                         "narrow it with params (node_id, service, since)")
    out = [_metric_row(r) for r in rows]
    return shape_rows(out, shaping if shaping.agg else Shaping(
        fields=shaping.fields, limit=shaping.limit, order_by=None))


def _grouped_rows(tx: Any, where: str, args: list[Any], s: Shaping,
                  limit: bool = False) -> list[dict[str, Any]]:
    """``limit``: the groups come in key order and only ``s.limit`` of them are wanted (an
    index in that order stops after them: 200 nodes of 10,000, not every sample)."""
    cols = [f"{_SQL_AGGS[fn]}({f}) AS {f}" for f, fn in s.agg.items()]
    if s.group_by is not None:
        desc = " DESC" if s.order_by == s.group_by and s.descending else ""
        sql = (f"SELECT {s.group_by} AS g, {', '.join(cols)} FROM node_samples WHERE {where}"
               f" GROUP BY {s.group_by} ORDER BY {s.group_by}{desc}")
        if limit:
            sql += f" LIMIT {int(s.limit)}"
    else:
        sql = f"SELECT {', '.join(cols)} FROM node_samples WHERE {where}"
    out = []
    for r in tx.all(sql, args):
        row: dict[str, Any] = {} if s.group_by is None else {s.group_by: r["g"]}
        for f, fn in s.agg.items():
            v = r[f]
            if fn == "count":
                v = int(v or 0)
            elif v is not None and not isinstance(v, (int, float)):
                v = float(v)  # PostgreSQL's numeric sums and means
            row[f] = v
        if s.group_by == "t":
            row["t"] = float(row["t"])
        out.append(row)
    return out


def _grouped_in_sql(tx: Any, where: str, args: list[Any], s: Shaping) -> list[dict[str, Any]]:
    keyed = s.group_by is not None and s.order_by in (None, s.group_by)
    return shape_rows(_grouped_rows(tx, where, args, s, limit=keyed),
                      Shaping(fields=s.fields, order_by=s.order_by, descending=s.descending,
                              limit=s.limit))
