"""One group-commit batch holding every kind of report, on SQLite and a real PostgreSQL: each
report gets its own outcome and only its own rows change (on PostgreSQL the batch's whole
reports are written a statement per table for all of them, not one node at a time)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from portal_helpers import MODULE_ID, heartbeat, service_row

from oarbank_ui.ingest.report import Report, report_digest
from oarbank_ui.ingest.validate import parse_report
from oarbank_ui.store.heartbeats import open_store
from oarbank_ui.store.schema import services_sql
from oarbank_ui.store.tokens import token_hash


@pytest.fixture
def store(store_url: str):  # type: ignore[no-untyped-def]
    s = open_store(store_url)
    yield s
    s.close()


def report(doc: dict[str, Any], at: float, token: str) -> Report:
    digest = doc["alive"] if "alive" in doc else report_digest(doc)
    return Report(parse_report(doc), digest, at, token_hash(token))


def rows(store: Any, node_id: str) -> list[tuple[Any, ...]]:
    """The node's rows as the store's readers see them: (service, users, reported_at,
    rss_bytes)."""
    with store.backend.read() as tx:
        return sorted((r["service"], r["users"], r["reported_at"], r["rss_bytes"]) for r in tx.all(
            services_sql("node_id = ? AND module = ?"), (node_id, MODULE_ID, 100)))


def samples(store: Any, node_id: str) -> list[tuple[str, int, int]]:
    """The node's history samples: (service, users, samples folded in)."""
    with store.backend.read() as tx:
        return sorted((r["service"], r["users"], r["samples"]) for r in tx.all(
            "SELECT service, users, samples FROM node_samples WHERE node_id = ?", (node_id,)))


def test_every_kind_of_report_in_one_batch_gets_its_own_outcome(store: Any) -> None:
    tokens = {n: store.issue_token(n)[0] for n in ("new", "changed", "older", "revoked", "same")}
    t0 = time.time() // 300 * 300 + 1  # every report below in one 5-minute history bucket
    before = {
        "changed": heartbeat("changed", service_row(service="a", users=1),
                             service_row(service="b", users=2), t=t0),
        "older": heartbeat("older", service_row(users=7), t=t0 + 50),
        "revoked": heartbeat("revoked", service_row(users=3), t=t0),
        "same": heartbeat("same", service_row(users=4), t=t0),
    }
    first = store.record_batch([report(d, t0 + (50 if n == "older" else 0), tokens[n])
                                 for n, d in before.items()])
    assert [o.status for o in first] == ["applied"] * 4, first
    old_token = tokens["revoked"]
    store.issue_token("revoked")  # a new token: the old one is refused from now on

    now = t0 + 10
    docs = {
        "new": heartbeat("new", service_row(service="x", users=5), t=now),
        "changed": heartbeat("changed", service_row(service="a", users=9), t=now),
        "older": heartbeat("older", service_row(users=8), t=now),  # received before t0 + 50
        "revoked": heartbeat("revoked", service_row(users=6), t=now),
        "same": dict(before["same"], time=now),  # nothing new but its time
    }
    batch = [report(docs[n], now, old_token if n == "revoked" else tokens[n]) for n in docs]
    out = dict(zip(docs, store.record_batch(batch), strict=True))

    assert {n: o.status for n, o in out.items()} == {
        "new": "applied", "changed": "applied", "older": "not_applied", "revoked": "revoked",
        "same": "applied"}, out
    assert "received later" in out["older"].reason
    assert out["new"].digest == report_digest(docs["new"])
    # rows: replaced whole where applied (b gone), untouched where refused, times refreshed
    # where nothing was new
    assert rows(store, "new") == [("x", 5, now, None)]
    assert rows(store, "changed") == [("a", 9, now, None)]
    assert rows(store, "older") == [("model", 7, t0 + 50, None)]
    assert rows(store, "revoked") == [("model", 3, t0, None)]
    assert rows(store, "same") == [("model", 4, now, None)]
    # a sample per stored report and service, folded into its 5-minute bucket (t0 and t0 + 10
    # share one): the most users seen, how many samples; refused reports add none
    assert samples(store, "new") == [("x", 5, 1)]
    assert samples(store, "changed") == [("a", 9, 2), ("b", 2, 1)]
    assert samples(store, "older") == [("model", 7, 1)]
    assert samples(store, "revoked") == [("model", 3, 1)]
    assert samples(store, "same") == [("model", 4, 2)]

    # the digest each applied report was answered with is the one a still-alive may name
    later = now + 10
    alive = [report({"node_id": n, "hostname": f"host-{n}", "time": later,
                     "alive": out[n].digest}, later, tokens[n]) for n in ("new", "changed")]
    assert [o.status for o in store.record_batch(alive)] == ["applied", "applied"]
    assert rows(store, "changed") == [("a", 9, later, None)]


def test_a_batch_of_whole_reports_keeps_each_nodes_rows_apart(store: Any) -> None:
    # many nodes with several services each, all new in one batch, then all changed in one
    tokens = {f"n{i:03d}": store.issue_token(f"n{i:03d}")[0] for i in range(60)}
    for round_, t in enumerate((time.time(), time.time() + 5)):
        docs = [heartbeat(n, *(service_row(service=f"s{k}", users=i * 10 + k + round_,
                                           rss_bytes=1000 * i if k else None)
                               for k in range(i % 4 + 1)), t=t)
                for i, n in enumerate(tokens)]
        out = store.record_batch([report(d, t, tokens[d["node_id"]]) for d in docs])
        assert all(o.applied for o in out), [o for o in out if not o.applied]
        for i, n in enumerate(tokens):
            assert rows(store, n) == [(f"s{k}", i * 10 + k + round_, t, 1000 * i if k else None)
                                      for k in range(i % 4 + 1)], n


ODD_TEXTS = ['say "hi", {then} \\ go', "NULL", "null", "", "line one\nline two\ttab",
             "dès ünïcode, 漢字, \U0001F680", "x" * 4096]


def test_a_batch_stores_every_text_and_number_exactly_as_reported(store: Any) -> None:
    # the batch's rows travel as one parameter per column (on PostgreSQL an array literal
    # the server unnests): quoting, escapes, NULL-looking text, non-ASCII, the longest text
    # a report may hold, 64-bit counts and a time's every digit come back as they went
    tokens = {f"odd{i}": store.issue_token(f"odd{i}")[0] for i in range(len(ODD_TEXTS))}
    t = 1_733_322_222.123456789  # more digits than a float keeps: the float itself must
    docs = []
    for i, (n, text) in enumerate(zip(tokens, ODD_TEXTS, strict=True)):
        doc = heartbeat(n, service_row(service="model", error=text, held=text or None,
                                       health=None, rss_bytes=2**63 - 1 - i, loads=2**31 - 1),
                        hostname=f"{text[:200]}#{i}", t=t + i)
        doc["metrics"] = {"mem_used_bytes": 2**62 + i, "mem_reserved_bytes": None,
                          "mem_total_bytes": 2**63 - 1, "gpu_mem_used_bytes": 0,
                          "gpu_mem_total_bytes": None}
        docs.append(doc)
    out = store.record_batch([report(d, t + 1, tokens[d["node_id"]]) for d in docs])
    assert all(o.applied for o in out), out
    with store.backend.read() as tx:
        for i, d in enumerate(docs):
            row = tx.one(services_sql("node_id = ? AND module = ?"),
                         (d["node_id"], MODULE_ID, 10))
            assert row is not None
            want = d["services"][0]
            assert (row["error"], row["held"], row["health"], row["hostname"],
                    row["rss_bytes"], row["loads"], row["reported_at"]) == (
                want["error"], want["held"], None, d["hostname"], want["rss_bytes"],
                want["loads"], d["time"]), d["node_id"]
            node = tx.one("SELECT hostname, reported_at, mem_used_bytes, mem_reserved_bytes,"
                          " mem_total_bytes FROM nodes WHERE node_id = ?", (d["node_id"],))
            assert node == {"hostname": d["hostname"], "reported_at": d["time"],
                            "mem_used_bytes": 2**62 + i, "mem_reserved_bytes": None,
                            "mem_total_bytes": 2**63 - 1}, d["node_id"]


def test_a_pipelined_write_that_fails_leaves_nothing_and_the_next_one_commits(
        store: Any) -> None:
    """The group commits' transactions are pipelined on PostgreSQL (BEGIN and COMMIT sent with
    the statements): a body that raises, or a statement the server refuses (its later ones
    skipped), leaves none of the transaction's rows, and the next write on the same
    connection commits. SQLite runs the same writes as plain transactions."""
    backend = store.backend
    with backend.write() as tx:
        tx.run("CREATE TABLE probe (k INTEGER PRIMARY KEY)")
        tx.run("INSERT INTO probe VALUES (5)")
    with pytest.raises(RuntimeError), backend.write(pipelined=True) as tx:
        tx.run("INSERT INTO probe VALUES (1)")
        raise RuntimeError("the body fails")
    # (sqlite3's or psycopg's own error: the test names neither)
    with pytest.raises(Exception) as refused, backend.write(pipelined=True) as tx:  # noqa: PT011
        tx.run("INSERT INTO probe VALUES (2)")
        tx.run("INSERT INTO probe VALUES (5)")  # a duplicate key
        tx.run("INSERT INTO probe VALUES (3)")
    assert "unique" in str(refused.value).lower() or "duplicate" in str(refused.value).lower()
    with backend.write(pipelined=True) as tx:
        tx.run("INSERT INTO probe VALUES (7)")
        assert [r["k"] for r in tx.all("SELECT k FROM probe ORDER BY k")] == [5, 7]
    with backend.read() as tx:
        assert [r["k"] for r in tx.all("SELECT k FROM probe ORDER BY k")] == [5, 7]
