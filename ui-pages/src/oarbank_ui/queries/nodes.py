"""The ``nodes`` and ``node_metrics`` host queries, over what heartbeats already say and the
history the store keeps of them (``store/history.py``), on SQLite and PostgreSQL alike. The
store runs them on its connection (``HeartbeatStore.host_query``). Not the portal's own
``/metrics`` (``web/prometheus.py``).

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

from typing import Any

from .bucket_cache import BucketCache
from .services import QueryError, derive_state, iso_utc
from .shape import Shaping, shape_rows
from .times import resolve

__all__ = ["MAX_SCAN", "METRICS_PARAMS", "NODES_PARAMS", "node_metrics", "nodes_query"]

MAX_SCAN = 100_000
NODES_PARAMS = ("node_id", "hostname", "state", "online")
METRICS_PARAMS = ("node_id", "service", "state", "since", "until")
_SAMPLE_COLUMNS = ("node_id", "hostname", "service", "t", "res_s", "running", "ready", "users",
                   "rss_bytes", "loads", "mem_used_bytes", "mem_reserved_bytes",
                   "gpu_mem_used_bytes", "samples")
METRICS_FIELDS = (*_SAMPLE_COLUMNS, "state")
_SQL_AGGS = {"count": "COUNT", "sum": "SUM", "mean": "AVG", "min": "MIN", "max": "MAX"}


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
