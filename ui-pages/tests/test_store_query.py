"""Heartbeat validation, the store and the `services` host query (contract section 6).

The store tests run twice, against SQLite and against PostgreSQL (`store_url`): the same
queries must give the same answers."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from oarbank_ui.ingest.validate import HeartbeatError, parse_heartbeat
from oarbank_ui.queries.services import (
    COLUMNS,
    derive_state,
    derive_stopped_reason,
    was_evicted,
)
from oarbank_ui.store.heartbeats import HeartbeatStore, open_store
from oarbank_ui.store.migrations import MigrationError

MOD = "dev.example.modelserver"


@pytest.fixture
def store(store_url: str):  # type: ignore[no-untyped-def]
    s = open_store(store_url)
    yield s
    s.close()


def record(store: HeartbeatStore, doc: dict[str, Any]) -> None:
    assert store.record(parse_heartbeat(doc)).applied


# -- state and stopped_reason ---------------------------------------------------------------


def test_state_from_running_and_ready() -> None:
    assert derive_state(True, True) == "ready"
    assert derive_state(True, False) == "starting"
    assert derive_state(False, False) == "stopped"
    assert derive_state(False, True) == "stopped"


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        ({"held": "preempt_memory", "disabled": True, "withdrawn": True, "gpu_api_missing": True},
         "held: preempt_memory"),
        ({"held": None, "disabled": True, "withdrawn": True, "gpu_api_missing": True},
         "disabled"),
        ({"held": None, "disabled": False, "withdrawn": True, "gpu_api_missing": True},
         "withdrawn"),
        ({"held": None, "disabled": False, "withdrawn": False, "gpu_api_missing": True},
         "gpu api missing"),
        ({"held": None, "disabled": False, "withdrawn": False, "gpu_api_missing": False},
         "idle"),
    ],
)
def test_stopped_reason_priority(flags: dict[str, Any], reason: str) -> None:
    assert derive_stopped_reason(running=False, **flags) == reason
    assert derive_stopped_reason(running=True, **flags) is None  # null while running


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        # an evicted service (its row names the job it made room for) says so, after the
        # contract's four and before the catch-all idle
        ({"held": None, "disabled": False, "withdrawn": False, "gpu_api_missing": False},
         "evicted"),
        ({"held": "preempt_memory", "disabled": False, "withdrawn": False,
          "gpu_api_missing": False}, "held: preempt_memory"),
        ({"held": None, "disabled": True, "withdrawn": False, "gpu_api_missing": False},
         "disabled"),
    ],
)
def test_an_evicted_service_says_so(flags: dict[str, Any], reason: str) -> None:
    assert derive_stopped_reason(running=False, evicted=True, **flags) == reason
    assert derive_stopped_reason(running=True, evicted=True, **flags) is None
    assert was_evicted('{"evicted_for": "job j1 of module b", "service": "m"}')
    assert not was_evicted('{"evicted_for": null}') and not was_evicted(None)
    assert not was_evicted('{"evicted_for": ')  # unreadable: not said


# -- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.pop("node_id"), "node_id: missing"),
        (lambda d: d.update(node_id=""), "node_id: must not be empty"),
        (lambda d: d.update(node_id=7), "node_id: must be a string, got an integer"),
        (lambda d: d.update(time="now"), "time: must be unix seconds"),
        (lambda d: d.update(services={}), "services: must be a list, got an object"),
        (lambda d: d["services"][0].pop("users"), "services[0].users: missing"),
        (lambda d: d["services"][0].update(users=-1), "services[0].users: must be a whole number"),
        (lambda d: d["services"][0].update(users=True), "services[0].users: must be a whole"),
        (lambda d: d["services"][0].update(running="yes"),
         "services[0].running: must be true or false, got a string"),
        (lambda d: d["services"][0].update(lifecycle="sometimes"),
         "services[0].lifecycle: must be one of on_demand, always, manual"),
        (lambda d: d["services"][0].update(service="Model!"),
         "services[0].service: 'Model!' is not a service name"),
        (lambda d: d["services"][0].update(error=["x"]),
         "services[0].error: must be a string or null, got a list"),
        (lambda d: d["services"][0].update(error="a\x00b"),
         "services[0].error: must not contain NUL characters"),
        (lambda d: d.update(hostname="host\x00"), "hostname: must not contain NUL characters"),
        (lambda d: d["services"].append(dict(d["services"][0])),
         f"services[1]: {MOD}/model reported twice"),
        (lambda d: d["services"].__setitem__(0, "model"),
         "services[0]: must be an object, got a string"),
    ],
)
def test_malformed_heartbeat_names_the_field(make_heartbeat, make_row, mutate, message) -> None:  # type: ignore[no-untyped-def]
    doc = make_heartbeat("n1", make_row())
    mutate(doc)
    with pytest.raises(HeartbeatError) as e:
        parse_heartbeat(doc)
    assert message in str(e.value)


def test_not_an_object() -> None:
    with pytest.raises(HeartbeatError, match="must be a JSON object, got a list"):
        parse_heartbeat([])


def test_unknown_keys_are_kept_not_refused(make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    doc = make_heartbeat("n1", make_row(future_field=1))
    doc["jobs"] = []  # `status --json` shape: accepted
    hb = parse_heartbeat(doc)
    assert hb.services[0].raw["future_field"] == 1


# -- store and query ------------------------------------------------------------------------


def test_sqlite_store_uses_wal_and_is_owner_only(tmp_path: Path) -> None:
    store = HeartbeatStore(tmp_path / "hb.db")
    store.close()
    if sys.platform != "win32":
        assert (tmp_path / "hb.db").stat().st_mode & 0o777 == 0o600  # token hashes live here
    db = sqlite3.connect(tmp_path / "hb.db")
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert [r[0] for r in db.execute("SELECT version FROM schema_migrations ORDER BY 1")] \
            == [1, 2, 3, 4, 5, 6, 7]
    finally:
        db.close()


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc/self/fd (Linux)")
def test_a_store_newer_than_the_portal_is_refused_by_name_and_left_closed(tmp_path: Path) -> None:
    db = tmp_path / "hb.db"
    HeartbeatStore(db).close()
    with contextlib.closing(sqlite3.connect(db)) as newer:
        newer.execute("INSERT INTO schema_migrations VALUES (99, 'from the future', 0)")
        newer.commit()

    def open_files() -> list[str]:
        return [os.readlink(f) for f in Path("/proc/self/fd").iterdir() if f.is_symlink()]

    before = open_files()
    with pytest.raises(MigrationError, match="schema version 99 is newer than this portal"):
        HeartbeatStore(db)
    # the refusal still holds the half-made store (its traceback): its connection is closed
    assert [f for f in open_files() if f.startswith(str(db))] == \
        [f for f in before if f.startswith(str(db))]


def test_query_rows_have_exactly_the_contract_columns(store, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    t = time.time()
    record(store, make_heartbeat("node-a", make_row(users=2), hostname="gpu-01", t=t))
    record(store, make_heartbeat("node-b", make_row(running=False, ready=False), t=t))
    rows = store.services([MOD])
    assert [tuple(r) for r in rows] == [COLUMNS, COLUMNS]
    a, b = rows
    assert a == {"node_id": "node-a", "hostname": "gpu-01", "service": "model",
                 "health": "healthy", "state": "ready", "stopped_reason": None, "error": None,
                 "gpu_api_missing": False, "lifecycle": "on_demand", "users": 2,
                 "endpoint": True, "reported_at": t}
    assert (b["state"], b["stopped_reason"]) == ("stopped", "idle")


def test_latest_row_per_node_module_service_wins(store, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    record(store, make_heartbeat("n1", make_row(running=True, ready=False), t=100.0))
    record(store, make_heartbeat("n1", make_row(users=4), t=101.0))
    rows = store.services([MOD])
    assert len(rows) == 1
    assert (rows[0]["state"], rows[0]["users"], rows[0]["reported_at"]) == ("ready", 4, 101.0)


def test_reports_are_ordered_by_receipt_not_by_the_nodes_clock(store, make_heartbeat,  # type: ignore[no-untyped-def]
                                                               make_row) -> None:
    now = time.time()
    # A node whose clock is decades ahead (or a forged time) must not freeze its rows.
    ahead = parse_heartbeat(make_heartbeat("n1", make_row(users=4), t=4102444800.0))
    assert store.record(ahead, received_at=now - 2).applied
    later = parse_heartbeat(make_heartbeat("n1", make_row(users=1), t=100.0))
    assert store.record(later, received_at=now - 1).applied
    row = store.services([MOD])[0]
    assert (row["users"], row["reported_at"]) == (1, 100.0)  # the node's time, for display
    # A report received before the stored one (a replica's slow transaction) is not applied.
    late = parse_heartbeat(make_heartbeat("n1", make_row(users=9), t=200.0))
    res = store.record(late, received_at=now - 1.5)
    assert not res.applied and "received later" in res.reason
    assert store.services([MOD])[0]["users"] == 1


def test_a_report_is_the_nodes_whole_snapshot(store, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    other = make_row(module="dev.example.other", service="db")
    record(store, make_heartbeat("n1", make_row(), other, t=1.0))
    record(store, make_heartbeat("n1", make_row(), t=2.0))  # module `other` no longer enabled
    assert store.services(["dev.example.other"]) == []
    assert len(store.services([MOD])) == 1


def test_filters_and_other_modules(store, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    for n in ("a", "b", "c"):
        record(store, make_heartbeat(n, make_row(), make_row(service="tokenizer"),
                                     make_row(module="dev.example.other", service="model")))
    assert len(store.services([MOD])) == 6
    assert [r["service"] for r in store.services([MOD], node_id="b")] == ["model", "tokenizer"]
    assert [r["node_id"] for r in store.services([MOD], service="tokenizer")] == ["a", "b", "c"]
    assert len(store.services([MOD], node_id="b", service="model")) == 1
    assert store.services([MOD], node_id="zzz") == []
    assert len(store.services(["dev.example.other"])) == 3


def test_held_shows_why(store, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    record(store, make_heartbeat("n1", make_row(running=False, ready=False, held="preempt_memory",
                                                error="memory under the hard floor")))
    row = store.services([MOD])[0]
    assert row["stopped_reason"] == "held: preempt_memory"
    assert row["error"] == "memory under the hard floor"


def test_services_query_over_1000_nodes(store, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    """1,000 nodes, two modules each: at most 200 rows come back, in node order, through an
    index, never a scan of every row (PostgreSQL may pick the primary key or the by-node index
    plus an incremental sort, as its statistics say). The time is printed for the report
    (speed is the benchmark's business)."""
    t = time.time()
    for i in range(1000):
        record(store, make_heartbeat(f"node-{i:04d}",
                                     make_row(users=i % 5, running=i % 3 != 0, ready=i % 3 != 0),
                                     make_row(module="dev.example.other", service="db"), t=t))
    plan = store.query_plan(MOD)
    assert ("USING PRIMARY KEY" in plan or "USING INDEX" in plan  # SQLite's words
            or "Index Scan" in plan or "Index Only Scan" in plan), plan  # PostgreSQL's
    assert "SCAN service_rows" not in plan and "Seq Scan" not in plan, plan
    timings = []
    for _ in range(20):
        t0 = time.perf_counter()
        rows = store.services([MOD, "modelserver"])
        timings.append(time.perf_counter() - t0)
    assert len(rows) == 200
    assert [r["node_id"] for r in rows] == [f"node-{i:04d}" for i in range(200)]
    t0 = time.perf_counter()
    one = store.services([MOD], node_id="node-0999", service="model")
    filtered = time.perf_counter() - t0
    assert len(one) == 1 and one[0]["state"] == "stopped"  # 999 % 3 == 0
    # The cut is known, not silent; a filtered answer that fits is not cut.
    assert store.services_page([MOD])[1] is True
    assert store.services_page([MOD], node_id="node-0999") == (one, False)
    timings.sort()
    print(f"\nservices query over 1,000 nodes (2,000 rows): median {timings[10] * 1000:.2f} ms, "
          f"max {timings[-1] * 1000:.2f} ms for 200 rows; node+service filter "
          f"{filtered * 1000:.2f} ms")


def test_the_largest_report_is_stored_whole(store, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    """2,000 rows (MAX_SERVICES): written in chunks that stay under SQLite's parameter limit."""
    from oarbank_ui.ingest.validate import MAX_SERVICES

    rows = [make_row(service=f"s{i:04d}") for i in range(MAX_SERVICES)]
    record(store, make_heartbeat("big", *rows))
    assert store.services_page([MOD], node_id="big")[1] is True  # more than 200 stored
    assert [r["service"] for r in store.services([MOD], node_id="big", service="s1999")] == [
        "s1999"]
    assert store.summary()["services"] == {(MOD, "ready", ""): MAX_SERVICES}
