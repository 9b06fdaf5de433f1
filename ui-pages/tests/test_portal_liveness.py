"""Liveness (contract 6.3) and the operator's routes, against real portal processes: stale
nodes, an agent's last report, `node remove`, /healthz, /metrics, /v1/nodes paged; and the
same portal on PostgreSQL (two replicas on one database answer the same)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from typing import Any

from portal_helpers import MODULE_ID, heartbeat, service_row

from oarbank_ui.store import migrations

CLI = [sys.executable, "-m", "oarbank_ui.cli"]
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def hb(node: str, period: float = 10.0, **row: Any) -> dict[str, Any]:
    doc = heartbeat(node, service_row(**row))
    doc["heartbeat_s"] = period
    return doc


def wait_for(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def metric(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_node_that_stops_reporting_goes_stale(start_portal, store_url) -> None:  # type: ignore[no-untyped-def]
    p = start_portal(db=store_url)
    p.post_heartbeat(hb("quiet", period=0.3, users=2))
    p.post_heartbeat(hb("chatty", period=60))
    assert {r["node_id"]: r["state"] for r in p.services()} == {"quiet": "ready",
                                                                "chatty": "ready"}
    wait_for(lambda: p.services(node_id="quiet")[0]["state"] == "unknown")  # 3 x 0.3 s
    row = p.services(node_id="quiet")[0]
    assert re.fullmatch(rf"node not reporting \(last report {ISO}\)", row["stopped_reason"])
    assert row["users"] == 2  # the last known figures stay, flagged
    nodes = {n["node_id"]: n for n in p.get("/v1/nodes").json()}
    assert nodes["quiet"]["stale"] is True and nodes["quiet"]["liveness"].startswith(
        "not reporting (last report ")
    assert nodes["chatty"]["liveness"] == "reporting"
    # the panel shows it as a status with a warning tone; the index says so too
    panel = p.get(f"/nodes/quiet/modules/{MODULE_ID}/panels/node?format=json").json()
    (status,) = [v for v in panel["components"].values() if v["kind"] == "status"]
    assert (status["value"]["text"], status["value"]["tone"]) == ("unknown", "warn")
    assert 'tone-warn">not reporting (last report' in p.get("/").text
    metrics = p.get("/metrics").text
    assert metric(metrics, "oarbank_portal_nodes", liveness="stale") == 1
    assert metric(metrics, "oarbank_portal_services", module=MODULE_ID, state="unknown",
                  stopped_reason="node not reporting") == 1
    # it reports again: live again
    p.post_heartbeat(hb("quiet", period=60))
    assert p.services(node_id="quiet")[0]["state"] == "ready"


def test_an_agents_last_report_and_node_remove(start_portal, store_url) -> None:  # type: ignore[no-untyped-def]
    p = start_portal(db=store_url)
    last = hb("leaving", period=0.2, running=False, ready=False, users=0)
    last["agent_stopped"] = True
    assert p.post_heartbeat(last).status == 200
    time.sleep(0.8)  # past 3 periods: a node that said goodbye is stopped, not missing
    row = p.services(node_id="leaving")[0]
    assert (row["state"], row["stopped_reason"]) == ("stopped", "agent stopped")
    assert p.get("/v1/nodes").json()[0]["liveness"] == "agent stopped"

    token = p.token("leaving")
    r = subprocess.run([*CLI, "node", "remove", "leaving", "--db", str(p.db)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "node leaving removed (1 service rows, its token)" in r.stderr
    assert p.services() == [] and p.get("/v1/nodes").json() == []
    assert p.post_heartbeat(hb("leaving"), token=token).status == 401  # forgotten for good
    r = subprocess.run([*CLI, "node", "remove", "leaving", "--db", str(p.db)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no node leaving" in r.stderr


def test_healthz_and_metrics(start_portal, store_url) -> None:  # type: ignore[no-untyped-def]
    p = start_portal(db=store_url)
    r = p.get("/healthz")
    kind = "postgresql" if store_url.startswith("postgresql") else "sqlite"
    newest = migrations.available(kind)[-1].version  # the schema this package ships
    assert r.status == 200 and r.json() == {"ok": True, "store": kind, "schema": newest}
    for i in range(3):
        p.post_heartbeat(hb(f"n{i}", running=i != 2, ready=i != 2, disabled=i == 2))
    p.post_heartbeat(hb("n0"), token="oarbank_nope")
    p.services()
    m = p.get("/metrics")
    assert m.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = m.text
    assert metric(text, "oarbank_portal_nodes", liveness="reporting") == 3
    assert metric(text, "oarbank_portal_services", module=MODULE_ID, state="ready",
                  stopped_reason="") == 2
    assert metric(text, "oarbank_portal_services", module=MODULE_ID, state="stopped",
                  stopped_reason="disabled") == 1
    assert metric(text, "oarbank_portal_reports_accepted_total") == 3
    assert metric(text, "oarbank_portal_reports_refused_total", cause="unauthenticated") == 1
    assert metric(text, "oarbank_portal_reports_refused_total", cause="truncated") == 0
    assert metric(text, "oarbank_portal_request_seconds_count", route="heartbeat") == 4
    assert metric(text, "oarbank_portal_request_seconds_count", route="services") >= 1


def test_nodes_are_paged(start_portal) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    for i in range(7):
        p.post_heartbeat(hb(f"node-{i}"))
    seen, url, pages = [], "/v1/nodes?limit=3", 0
    while url:
        r = p.get(url)
        assert r.status == 200
        seen += [n["node_id"] for n in r.json()]
        pages += 1
        m = re.fullmatch(r'<(.+)>; rel="next"', r.headers.get("link", ""))
        url = m.group(1) if m else ""
    assert seen == [f"node-{i}" for i in range(7)] and pages == 3
    assert p.get("/v1/nodes?limit=0").status == 400
    r = p.get("/v1/nodes?limit=abc")
    assert r.status == 400 and "limit must be a whole number 1..1000" in r.json()["error"]
    assert p.get("/v1/nodes?colour=red").status == 400


def test_two_portals_on_one_postgresql_answer_the_same(start_portal, pg_cluster) -> None:  # type: ignore[no-untyped-def]
    url = pg_cluster.create_database()
    a = start_portal(db=url)
    b = start_portal(db=url)
    token = a.token("node-x")
    # a report through either replica is seen by both; the token is the fleet's, not a replica's
    assert a.post_heartbeat(hb("node-x", users=1), token=token).status == 200
    assert b.services() == a.services()
    assert b.post_heartbeat(hb("node-x", users=5), token=token).json()["applied"] is True
    assert [r["users"] for r in a.services()] == [5] and a.services() == b.services()
    assert a.get("/v1/nodes").json() == b.get("/v1/nodes").json()
    page = f"/modules/{MODULE_ID}/pages/overview?format=json"
    strip = lambda d: {k: v for k, v in d.items() if k != "rendered_at"}  # noqa: E731
    assert strip(a.get(page).json()) == strip(b.get(page).json())
    for p in (a, b):
        assert metric(p.get("/metrics").text, "oarbank_portal_nodes", liveness="reporting") == 1


def test_the_portal_outlives_its_database(start_portal, system_package) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL goes away: /healthz answers 503 with the reason, a report is answered 503
    (the agent retries a 5xx), the portal keeps running; the server back, all works again."""
    from pgcluster import PgCluster

    system_package("postgresql")
    cluster = PgCluster()
    try:
        p = start_portal(db=cluster.url())
        token = p.token("node-db")
        assert p.post_heartbeat(hb("node-db"), token=token).status == 200
        cluster.stop_server()
        r = p.get("/healthz", timeout=60)
        assert r.status == 503 and r.json()["ok"] is False and r.json()["store"] == "postgresql"
        r = p.post_heartbeat(hb("node-db", users=4), token=token)
        # the token lookup or the write, whichever meets the outage first: a 5xx, retried
        assert r.status == 503 and r.json()["error"].endswith("send it again")
        assert p.proc.poll() is None
        cluster.start_server()
        wait_for(lambda: p.get("/healthz", timeout=60).status == 200, 60)
        assert p.post_heartbeat(hb("node-db", users=4), token=token).status == 200
        assert [r["users"] for r in p.services()] == [4]
        p.proc.terminate()
        assert p.proc.wait(20) == 0
    finally:
        cluster.stop()
