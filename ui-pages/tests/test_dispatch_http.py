"""Fleet dispatch over real HTTP (contract section 10): a real `oarbank-portal serve` process on
each store (SQLite; PostgreSQL where the package is installed), submitters with tokens from the
real CLI. Nodes are played by the test: it posts claims, renews and results as an agent would
(the agent's side, `oarbank-agent run --claim`, is built elsewhere), so each request here is the
protocol's, not a stand-in for the portal."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time
from typing import Any

from dispatch_helpers import MODULE_ID, Node, call, offer, submitter_token
from portal_helpers import auth


def job(prompt: str = "hi", **over: Any) -> dict[str, Any]:
    return {"module": MODULE_ID, "stage": "generate", "payload": {"prompt": prompt}} | over


def submit(p: Any, token: str, jobs: list[dict[str, Any]], **extra: Any) -> Any:
    return call(p.url, "POST", "/v1/jobs", {"jobs": jobs, **extra}, token=token)


def test_a_batch_is_granted_once_completes_once_and_is_read_back(start_portal: Any,
                                                                 store_url: str) -> None:
    p = start_portal(db=store_url)
    alice = submitter_token(store_url, "alice")
    r = submit(p, alice, [job(f"p{i}") for i in range(5)], idempotency_key="prompts#0")
    assert r.status == 201, r.text
    ids = [j["job_id"] for j in r.doc["jobs"]]
    assert len(set(ids)) == 5 and {j["state"] for j in r.doc["jobs"]} == {"queued"}
    # the same submit again (its answer was lost): the same jobs, none new
    again = submit(p, alice, [job(f"p{i}") for i in range(5)], idempotency_key="prompts#0")
    assert again.status == 200 and again.doc["replayed"] is True
    assert [j["job_id"] for j in again.doc["jobs"]] == ids
    other = submit(p, alice, [job("else")], idempotency_key="prompts#0")
    assert other.status == 409 and other.doc["error"] == "idempotency_key_reused"

    n1 = Node(p, "n1")
    first = n1.claim(offer(free=3))
    assert [g["job_id"] for g in first] == ids[:3]  # oldest first, as many as free tokens
    assert {(g["placement"], g["generation"]) for g in first} == {("ready", 1)}
    assert all(g["expires_at"] - g["issued_at"] == 60 for g in first)
    rest = n1.claim(offer(free=4))
    assert [g["job_id"] for g in rest] == ids[3:]
    assert n1.claim(offer(free=4)) == []  # nothing is granted twice
    for g in first + rest:
        assert n1.result(g).doc == {"accepted": True, "job_id": g["job_id"],
                                    "state": "succeeded"}
    replay = n1.result(first[0])  # the answer was lost: sent again, changes nothing
    assert replay.status == 200 and replay.doc["replayed"] is True

    rec = call(p.url, "GET", f"/v1/jobs/{ids[0]}", token=alice).doc
    assert rec["state"] == "succeeded" and rec["node_id"] == "n1" and rec["grants"] == 1
    assert rec["payload"] == {"prompt": "p0"} and rec["result"]["payload"]["by"] == "n1"
    assert rec["record"]["state"] == "succeeded" and rec["expires_at"] > rec["finished_at"]
    batch = r.doc["batch_id"]
    counts = call(p.url, "GET", f"/v1/batches/{batch}", token=alice).doc
    assert counts["states"]["succeeded"] == 5 and counts["nodes"] == {
        "n1": {"running": 0, "succeeded": 5, "failed": 0}}
    page = call(p.url, "GET", f"/v1/jobs?batch={batch}&limit=2", token=alice)
    assert [j["job_id"] for j in page.doc] == ids[:2] and "rel=\"next\"" in page.headers["link"]
    text = _metrics(p)
    assert 'oarbank_portal_dispatch_grants_total{placement="ready"} 5.0' in text
    assert 'oarbank_portal_dispatch_results_total{state="succeeded"} 5.0' in text


def _metrics(p: Any) -> str:
    import urllib.request

    with urllib.request.urlopen(p.url + "/metrics", timeout=10) as f:
        return f.read().decode()  # type: ignore[no-any-return]


def test_an_expired_lease_requeues_without_charge_and_a_late_result_is_refused(
        start_portal: Any, store_url: str) -> None:
    p = start_portal(db=store_url, args=("--lease-s", "2"))
    alice = submitter_token(store_url, "alice")
    job_id = submit(p, alice, [job()]).doc["jobs"][0]["job_id"]
    n1, n2 = Node(p, "n1"), Node(p, "n2")
    [g1] = n1.claim()
    time.sleep(1.2)
    renewed = n1.renew(g1)  # a renew within the lease extends it
    assert [x["attempt_id"] for x in renewed["renewed"]] == [g1["attempt_id"]]
    assert renewed["renewed"][0]["expires_at"] > g1["expires_at"]
    time.sleep(2.5)  # n1 went quiet: its lease ran out
    lost = n1.result(g1)
    assert lost.status == 409 and lost.doc["error"] == "lease_lost", lost.text
    queued = call(p.url, "GET", f"/v1/jobs/{job_id}", token=alice).doc
    assert queued["state"] == "queued" and queued["lease_expiries"] == 1
    [g2] = n2.claim()
    assert g2["job_id"] == job_id and g2["generation"] == 2
    late = n1.result(g1)  # n1's result, later still: a newer generation exists
    assert late.status == 409 and late.doc["error"] == "stale_generation", late.text
    assert n1.renew(g1)["lost"] == [{"attempt_id": g1["attempt_id"],
                                     "error": "stale_generation"}]
    assert n2.result(g2).status == 200
    done = call(p.url, "GET", f"/v1/jobs/{job_id}", token=alice).doc
    assert (done["state"], done["node_id"], done["generation"]) == ("succeeded", "n2", 2)
    assert done["result"]["payload"]["by"] == "n2"  # completed once, by the live attempt
    assert "oarbank_portal_dispatch_lease_expiries_total 1.0" in _metrics(p)


def test_a_claim_carries_results_each_answered_as_if_sent_alone(start_portal: Any,
                                                                store_url: str) -> None:
    p = start_portal(db=store_url)
    alice = submitter_token(store_url, "alice")
    ids = [j["job_id"] for j in submit(p, alice, [job(prompt=str(i)) for i in range(5)]).doc[
        "jobs"]]
    n1, n2 = Node(p, "n1"), Node(p, "n2")
    g = n1.claim(offer(free=3))
    [theirs] = n2.claim(offer(free=1))
    moved = dict(n1.result_doc(g[1]), node_id="n2")  # n1 cannot report for another node
    carried = [n1.result_doc(g[0]), n1.result_doc(g[1], "failed"),
               {"attempt_id": g[2]["attempt_id"]}, n1.result_doc(theirs), moved]
    del carried[0]["node_id"]  # the claim's node_id stands for a result that leaves it out
    r = n1.post("/v1/agent/claim", {"node_id": "n1", "wait_s": 0, "modules": [offer(free=2)],
                                    "results": carried})
    assert r.status == 200, r.text
    answers = r.doc["results"]  # in the order sent
    assert answers[0] == {"attempt_id": g[0]["attempt_id"], "status": 200, "accepted": True,
                          "job_id": g[0]["job_id"], "state": "succeeded"}
    assert (answers[1]["status"], answers[1]["state"]) == (200, "failed")
    assert answers[2]["status"] == 400 and answers[2]["field"] == "results[2].generation"
    assert (answers[3]["status"], answers[3]["error"]) == (409, "not_your_attempt")
    assert answers[4]["status"] == 400 and answers[4]["field"] == "results[4].node_id"
    assert [x["job_id"] for x in r.doc["grants"]] == ids[4:]  # and the claim's own grants
    # stored as if sent alone: the same result again is a replay, the states are the results'
    again = n1.result(g[0])
    assert again.status == 200 and again.doc["replayed"] is True, again.text
    states = {i: call(p.url, "GET", f"/v1/jobs/{i}", token=alice).doc["state"] for i in ids}
    assert [states[x["job_id"]] for x in (g[0], g[1], g[2], theirs)] == [
        "succeeded", "failed", "running", "running"]
    # nothing to grant: a claim carrying results is answered at once, not held for wait_s
    started = time.monotonic()
    r = n1.post("/v1/agent/claim", {"node_id": "n1", "wait_s": 20, "modules": [offer()],
                                    "results": [n1.result_doc(g[2])]}, timeout=30)
    assert r.status == 200 and time.monotonic() - started < 10, r.text
    assert r.doc["grants"] == [] and r.doc["results"][0]["accepted"] is True, r.text
    # the list itself malformed: the claim is refused whole, naming it; nothing changed
    for bad, words in (({"x": 1}, "must be a list"), ([{}] * 65, "at most 64 in one claim")):
        r = n1.post("/v1/agent/claim", {"node_id": "n1", "modules": [offer()],
                                        "results": bad})
        assert r.status == 400 and r.doc["field"] == "results" and words in r.doc["detail"]
    text = _metrics(p)
    assert 'oarbank_portal_dispatch_results_total{state="succeeded"} 2.0' in text
    assert 'oarbank_portal_dispatch_results_total{state="failed"} 1.0' in text
    assert 'oarbank_portal_dispatch_results_refused_total{error="not_your_attempt"} 1.0' in text


def test_bad_input_names_the_field_and_stores_nothing(start_portal: Any) -> None:
    p = start_portal()
    alice = submitter_token(p.db, "alice")
    cases = [
        ({"jobs": [job(), job(module="dev.example.nothing")]}, "jobs[1].module",
         "unknown module 'dev.example.nothing'"),
        ({"jobs": [job(stage="train")]}, "jobs[0].stage", "has no stage 'train' (generate)"),
        ({"jobs": [job(payload=["not", "an", "object"])]}, "jobs[0].payload", "an object"),
        ({"jobs": [job(payload={"x": "y" * 70_000})]}, "jobs[0].payload", "over the limit"),
        ({"jobs": [job(priority=3)]}, "jobs[0].priority", "unknown key"),
        ({"jobs": []}, "jobs", "1 to 10000"),
        ({"module": MODULE_ID, "stage": "generate"}, "payload", "must be an object"),
    ]
    for body, field, words in cases:
        r = call(p.url, "POST", "/v1/jobs", body, token=alice)
        assert r.status == 400 and r.doc["field"] == field and words in r.doc["detail"], r.text
    assert Node(p, "n1").claim() == []  # none of them was stored
    r = call(p.url, "POST", "/v1/jobs", raw=b"{not json", token=alice)
    assert r.status == 400 and "not JSON" in r.doc["detail"]
    bad_claim = Node(p, "n1").post("/v1/agent/claim", {"node_id": "n1", "modules": [
        offer(state="warm")]})
    assert bad_claim.status == 400 and bad_claim.doc["field"] == "modules[0].services[0].state"


def test_credentials_are_separate_and_each_submitter_sees_only_its_own(
        start_portal: Any) -> None:
    p = start_portal()
    alice, bob = submitter_token(p.db, "alice"), submitter_token(p.db, "bob")
    n1, n2 = Node(p, "n1"), Node(p, "n2")
    job_id = submit(p, alice, [job()]).doc["jobs"][0]["job_id"]
    assert call(p.url, "POST", "/v1/jobs", {"jobs": [job()]}, token=n1.token).status == 401
    assert call(p.url, "GET", f"/v1/jobs/{job_id}").status == 401
    refused = call(p.url, "POST", "/v1/agent/claim", {"node_id": "n1"}, token=alice)
    assert refused.status == 401 and refused.headers["www-authenticate"].startswith("Bearer")
    assert call(p.url, "GET", f"/v1/jobs/{job_id}", token=bob).status == 404  # as if none
    assert call(p.url, "POST", f"/v1/jobs/{job_id}/cancel", {}, token=bob).status == 404
    wrong = n1.post("/v1/agent/claim", {"node_id": "n2", "modules": [offer()]})
    assert wrong.status == 403 and wrong.doc["error"] == "wrong_node"
    [g] = n1.claim()
    stolen = n2.result(g)  # a result for a lease that is not n2's: refused, the job unharmed
    assert stolen.status == 409 and stolen.doc["error"] == "not_your_attempt"
    assert call(p.url, "GET", f"/v1/jobs/{job_id}", token=alice).doc["state"] == "running"
    assert n1.result(g).status == 200
    assert "not its own" in p.log.read_text() or "refused" in p.log.read_text()


def test_claims_that_come_together_share_transactions_each_answered_as_if_alone(
        start_portal: Any, store_url: str) -> None:
    """Thirty nodes claim at the same moment, each carrying a result, with two more whose
    tokens are refused (one revoked by the real CLI, one naming another node). The claims are
    written by the portal's group commit, several to a transaction (its counters say how
    many); each node still gets its own answer: its grants, each job once, its result
    accepted; the two refused get 401 and 403 and change nothing."""
    import subprocess
    import sys

    p = start_portal(db=store_url)
    alice = submitter_token(store_url, "alice")
    ids = [j["job_id"] for j in submit(p, alice, [job(f"{i}") for i in range(200)]).doc["jobs"]]
    nodes = [Node(p, f"n{i:02d}") for i in range(30)]
    firsts = {n.node_id: n.claim(offer(free=1))[0] for n in nodes}  # one running job each
    revoked, thief = Node(p, "gone"), Node(p, "thief")
    subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "token", "revoke", "gone", "--db",
                    str(store_url)], check=True, capture_output=True, timeout=60)
    before = _metrics(p)
    answers: dict[str, Any] = {}
    start = threading.Barrier(len(nodes) + 2)

    def claim(n: Node, doc: dict[str, Any]) -> None:
        start.wait()
        answers[n.node_id] = n.post("/v1/agent/claim", doc)

    threads = [threading.Thread(target=claim, args=(n, {
        "node_id": n.node_id, "max_grants": 2, "modules": [offer(free=2)],
        "results": [n.result_doc(firsts[n.node_id])]})) for n in nodes]
    threads.append(threading.Thread(target=claim, args=(revoked, {
        "node_id": "gone", "modules": [offer()]})))
    threads.append(threading.Thread(target=claim, args=(thief, {
        "node_id": "n01", "modules": [offer()]})))  # its own token, n01's name
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers["gone"].status == 401
    assert answers["thief"].status == 403 and answers["thief"].doc["error"] == "wrong_node"
    good = {n.node_id: answers[n.node_id] for n in nodes}
    assert all(a.status == 200 for a in good.values()), [a.doc for a in good.values()]
    for n in nodes:
        doc = good[n.node_id].doc
        assert [r["status"] for r in doc["results"]] == [200], doc
        assert len(doc["grants"]) == 2
    granted = [g["job_id"] for a in good.values() for g in a.doc["grants"]]
    granted += [g["job_id"] for g in firsts.values()]
    assert len(granted) == len(set(granted)) and set(granted) <= set(ids)
    after = _metrics(p)
    claims = _counter(after, "oarbank_portal_dispatch_claims_total") - _counter(
        before, "oarbank_portal_dispatch_claims_total")
    transactions = _counter(after, "oarbank_portal_dispatch_claim_transactions_total") - \
        _counter(before, "oarbank_portal_dispatch_claim_transactions_total")
    assert claims == len(threads)  # (a token is checked in the claim's own transaction)
    assert transactions < claims, (transactions, claims)


def _counter(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith(name + " "))


def test_a_module_a_node_does_not_offer_gets_none_of_its_jobs(start_portal: Any) -> None:
    p = start_portal()
    alice = submitter_token(p.db, "alice")
    submit(p, alice, [job()])
    n1 = Node(p, "n1")
    assert n1.claim(offer(module="dev.example.other")) == []
    assert n1.claim({"module": MODULE_ID, "stages": ["other"], "services": []}) == []
    assert len(n1.claim(offer())) == 1


def test_a_long_poll_answers_as_soon_as_work_arrives(start_portal: Any) -> None:
    p = start_portal()
    alice = submitter_token(p.db, "alice")
    n1 = Node(p, "n1")
    got: list[Any] = []
    started = time.monotonic()
    t = threading.Thread(target=lambda: got.append((n1.claim(wait_s=20),
                                                    time.monotonic() - started)))
    t.start()
    time.sleep(1.0)
    submit(p, alice, [job()])
    t.join(30)
    grants, took = got[0]
    assert len(grants) == 1 and 1.0 <= took < 5.0, took
    started = time.monotonic()
    assert n1.claim(wait_s=1.5) == [] and time.monotonic() - started >= 1.4  # held, then empty


def test_a_long_poll_whose_node_went_away_grants_nothing(start_portal: Any) -> None:
    p = start_portal()
    alice = submitter_token(p.db, "alice")
    n1 = Node(p, "n1")
    host, port = p.url[len("http://"):].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("POST", "/v1/agent/claim", body=json.dumps(
        {"node_id": "n1", "wait_s": 20, "modules": [offer()]}).encode(),
        headers={"Content-Type": "application/json", **auth(n1.token)})
    time.sleep(0.5)  # the claim is held: nothing to grant yet
    conn.close()  # the node goes (stopped, its request timed out) without reading an answer
    (jid,) = [j["job_id"] for j in submit(p, alice, [job()]).doc["jobs"]]
    time.sleep(2.5)  # past the held poll's next look (every second), had it still been waiting
    r = call(p.url, "GET", f"/v1/jobs/{jid}", token=alice)
    assert (r.doc["state"], r.doc["grants"]) == ("queued", 0), r.text
    # the next claim gets it: its first grant, not one lost to a lease's expiry
    (g,) = n1.claim()
    assert (g["job_id"], g["generation"]) == (jid, 1)


def test_warmth_decides_where_a_trickle_goes_and_a_burst_spreads(start_portal: Any,
                                                                  store_url: str) -> None:
    """n1 has the model warm; n2 has it stopped (a 30 s load, 1 s jobs). A trickle waits for
    n1; a burst of 200 (200 x 1 s / 4 warm tokens = 50 s > 30 s) starts a copy on n2."""
    p = start_portal(db=store_url)
    alice = submitter_token(store_url, "alice")
    n1, n2 = Node(p, "n1"), Node(p, "n2")
    assert n1.claim(offer(free=0, load_s=30, job_s=1)) == []  # busy, but its warmth is known
    submit(p, alice, [job("trickle")])
    assert n2.claim(offer(state="stopped", load_s=30, job_s=1)) == []
    submit(p, alice, [job(f"burst{i}") for i in range(200)])
    cold = n2.claim(offer(state="stopped", load_s=30, job_s=1))
    assert len(cold) == 4 and {g["placement"] for g in cold} == {"cold"}
    assert 'oarbank_portal_dispatch_cold_starts_total 4.0' in _metrics(p)


def test_a_cold_grant_counts_as_a_copy_starting_before_its_node_claims_again(
        start_portal: Any, store_url: str) -> None:
    """Two nodes with the model stopped claim one after the other, as claims answered at the
    same moment do: n1's cold grant is a copy starting for n2's claim (from the store, before
    n1 claims again), so 10 jobs start one copy, not two; 200 more start a second."""
    p = start_portal(db=store_url)
    alice = submitter_token(store_url, "alice")
    n1, n2 = Node(p, "n1"), Node(p, "n2")
    stopped = offer(state="stopped", load_s=30, job_s=1)
    submit(p, alice, [job(f"j{i}") for i in range(10)])
    assert [g["placement"] for g in n1.claim(stopped)] == ["cold"] * 4
    assert n2.claim(stopped) == []  # 6 x 1 s / 4 tokens starting < 30 s
    assert n1.claim(offer(state="starting", free=0, load_s=30, job_s=1)) == []
    assert n2.claim(stopped) == []  # n1's copy counted once, from its claim now
    submit(p, alice, [job(f"burst{i}") for i in range(200)])
    assert [g["placement"] for g in n2.claim(stopped)] == ["cold"] * 4


def test_a_cold_grant_counts_as_starting_while_its_attempts_live_past_a_lease(
        start_portal: Any, store_url: str) -> None:
    """A load longer than a lease: n1 took its cold grant and claims no more (no room) while
    its service loads, renewing its leases. Its copy still counts as starting for n2 after a
    lease has passed (a lease window would forget it, and every idle node would start one);
    once its attempts end, it no longer does."""
    p = start_portal(db=store_url, args=("--lease-s", "2"))
    alice = submitter_token(store_url, "alice")
    n1, n2 = Node(p, "n1"), Node(p, "n2")
    stopped = offer(state="stopped", load_s=30, job_s=1)
    submit(p, alice, [job(f"j{i}") for i in range(10)])
    grants = n1.claim(stopped)
    assert [g["placement"] for g in grants] == ["cold"] * 4
    for _ in range(3):  # 3 s: past the 2 s lease, n1's attempts renewed all along
        time.sleep(1.0)
        assert len(n1.renew(*grants)["renewed"]) == 4
    assert n2.claim(stopped) == []  # 6 x 1 s / 4 tokens starting < 30 s
    for g in grants:
        assert n1.result(g).status == 200
    assert [g["placement"] for g in n2.claim(stopped)] == ["cold"] * 4  # no copy starting


def test_warm_blind_sends_a_trickle_to_a_cold_node(start_portal: Any) -> None:
    """The comparison's mode (``serve --placement warm-blind``): first come, first served."""
    p = start_portal(args=("--placement", "warm-blind"))
    alice = submitter_token(p.db, "alice")
    n1, n2 = Node(p, "n1"), Node(p, "n2")
    n1.claim(offer(free=0, load_s=30, job_s=1))
    submit(p, alice, [job("trickle")])
    assert [g["placement"] for g in n2.claim(offer(state="stopped", load_s=30,
                                                   job_s=1))] == ["cold"]


def test_cancel_stops_a_running_job_and_refuses_its_result(start_portal: Any) -> None:
    p = start_portal()
    alice = submitter_token(p.db, "alice")
    r = submit(p, alice, [job("a"), job("b"), job("c")])
    a, b, c = (j["job_id"] for j in r.doc["jobs"])
    n1 = Node(p, "n1")
    [g] = n1.claim(offer(free=1))
    assert g["job_id"] == a
    cancelled = call(p.url, "POST", f"/v1/jobs/{a}/cancel", {}, token=alice)
    assert cancelled.status == 200 and cancelled.doc["state"] == "cancelled"
    assert n1.renew(g)["lost"] == [{"attempt_id": g["attempt_id"], "error": "cancelled"}]
    refused = n1.result(g)
    assert refused.status == 409 and refused.doc["error"] == "cancelled"
    again = call(p.url, "POST", f"/v1/jobs/{a}/cancel", {}, token=alice)
    assert again.status == 409 and again.doc["error"] == "job_done"
    batch = call(p.url, "POST", f"/v1/batches/{r.doc['batch_id']}/cancel", {}, token=alice)
    assert batch.doc == {"cancelled": 2}
    assert n1.claim(offer()) == []


def test_a_portal_killed_and_started_again_carries_on_from_the_store(
        start_portal: Any, store_url: str) -> None:
    """No dispatcher state lives only in the process: kill -9 between the grant and the
    result; the next portal on the same store accepts the result and grants the rest."""
    p = start_portal(db=store_url)
    alice = submitter_token(store_url, "alice")
    ids = [j["job_id"] for j in submit(p, alice, [job("a"), job("b")]).doc["jobs"]]
    n1 = Node(p, "n1")
    [g] = n1.claim(offer(free=1))
    os.killpg(p.proc.pid, signal.SIGKILL)
    p.proc.wait(10)
    q = start_portal(db=store_url)
    n1.portal = q
    assert n1.result(g).status == 200
    [g2] = n1.claim(offer(free=1))
    assert g2["job_id"] == ids[1] and n1.result(g2).status == 200
    states = [call(q.url, "GET", f"/v1/jobs/{i}", token=alice).doc["state"] for i in ids]
    assert states == ["succeeded", "succeeded"]


def test_the_store_away_is_a_503_with_retry_after_and_nothing_lost(
        start_portal: Any, system_package: Any) -> None:
    from pgcluster import PgCluster

    system_package("postgresql")
    cluster = PgCluster()  # its own server: this test stops it
    try:
        db = cluster.create_database()
        p = start_portal(db=db)
        alice = submitter_token(db, "alice")
        n1 = Node(p, "n1")
        job_id = submit(p, alice, [job()]).doc["jobs"][0]["job_id"]
        cluster.stop_server()
        for r in (submit(p, alice, [job("lost?")]), n1.post("/v1/agent/claim", {
                "node_id": "n1", "modules": [offer()]}, timeout=60)):
            assert r.status == 503 and r.doc["error"] == "unavailable", r.text
            assert int(r.headers["retry-after"]) > 0
        cluster.start_server()
        deadline = time.monotonic() + 60
        while call(p.url, "GET", "/healthz", timeout=60).status != 200:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        [g] = n1.claim()
        assert g["job_id"] == job_id and n1.claim() == []  # the refused submit stored nothing
    finally:
        cluster.stop()


def test_two_portals_on_one_postgresql_never_grant_a_job_twice(
        start_portal: Any, pg_cluster: Any) -> None:
    """Four nodes claim at once through two portal processes on one database (FOR UPDATE SKIP
    LOCKED): every job is granted exactly once."""
    db = pg_cluster.create_database()
    a, b = start_portal(db=db), start_portal(db=db)
    alice = submitter_token(db, "alice")
    ids = [j["job_id"] for j in submit(a, alice, [job(f"{i}") for i in range(120)]).doc["jobs"]]
    nodes = [Node(a if i % 2 else b, f"n{i}") for i in range(4)]
    errors: list[BaseException] = []

    def work(n: Node) -> None:
        try:
            while True:
                got = n.claim(offer(free=3))
                if not got:
                    return
                for g in got:
                    assert n.result(g).status == 200
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    granted = [g["job_id"] for n in nodes for g in n.grants]
    assert sorted(granted) == sorted(ids)  # each once
    assert sum(1 for n in nodes if n.grants) >= 2


def test_postgresql_reads_a_queues_head_from_the_queued_rows_alone(
        start_portal: Any, pg_cluster: Any) -> None:
    """Jobs leave a queue from its front, so its oldest rows are done ones. PostgreSQL's
    planner sees no link between age and state: reading the head in seq order through the
    primary key stepped over every done row on each claim, and right after a large submit (its
    statistics still saying the table is empty) it sorted every queued row. The portal's
    claim reads it through the index of queued rows in both cases (migration 0007, and
    statistics refreshed after a large submit)."""
    import psycopg

    db = pg_cluster.create_database()
    p = start_portal(db=db)
    alice = submitter_token(db, "alice")
    assert submit(p, alice, [job(f"{i}") for i in range(2000)]).status == 201

    def plan() -> str:  # the claim's read of the stage's oldest queued jobs (dispatch/claims.py)
        with psycopg.connect(db) as conn:
            return "\n".join(r[0] for r in conn.execute(
                "EXPLAIN SELECT job_id, payload, generation, submitted_at FROM jobs WHERE state ="
                " 'queued'"
                " AND module = %s AND stage = %s ORDER BY seq + 0 LIMIT 4 FOR UPDATE SKIP"
                " LOCKED", (MODULE_ID, "generate"), prepare=True))

    with psycopg.connect(db) as conn:  # the portal's own ANALYZE, not autovacuum's
        assert conn.execute("SELECT last_analyze FROM pg_stat_user_tables WHERE relname ="
                            " 'jobs'").fetchone()[0] is not None
    right_after_submit = plan()
    assert "jobs_queue_head" in right_after_submit, right_after_submit
    assert "Sort" not in right_after_submit, right_after_submit
    node = Node(p, "n1")
    for _ in range(100):  # the first 400 jobs done, at the queue's front
        for g in node.claim(offer(free=4)):
            assert node.result(g).status == 200
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("ANALYZE jobs")  # as autovacuum would, by now
    drained = plan()
    assert "jobs_queue_head" in drained and "Sort" not in drained, drained


def test_the_jobs_and_attempts_host_queries(start_portal: Any) -> None:
    """What a module page reads (contract 10.8): one row per job and per grant, the module's."""
    p = start_portal(args=("--lease-s", "1"))
    alice = submitter_token(p.db, "alice")
    ids = [j["job_id"] for j in submit(p, alice, [job("a"), job("b")]).doc["jobs"]]
    n1, n2 = Node(p, "n1"), Node(p, "n2")
    [g] = n1.claim(offer(free=1))
    time.sleep(1.5)  # its lease runs out: the job goes to n2
    got = n2.claim(offer(free=4))
    assert sorted(x["job_id"] for x in got) == sorted(ids)
    for x in got:
        assert n2.result(x).status == 200
    jobs = call(p.url, "GET", "/v1/queries/jobs?module=modelserver").doc
    assert sorted((j["job_id"], j["state"], j["node_id"], j["grants"], j["lease_expiries"])
                  for j in jobs) == sorted([(g["job_id"], "succeeded", "n2", 2, 1),
                                            (next(i for i in ids if i != g["job_id"]),
                                             "succeeded", "n2", 1, 0)])
    assert {j["submitter"] for j in jobs} == {"alice"} and "payload" not in jobs[0]
    attempts = call(p.url, "GET", f"/v1/queries/attempts?module={MODULE_ID}"
                                  f"&job_id={g['job_id']}").doc
    assert [(a["node_id"], a["generation"], a["state"]) for a in attempts] == [
        ("n2", 2, "succeeded"), ("n1", 1, "expired")]
    bad = call(p.url, "GET", f"/v1/queries/jobs?module={MODULE_ID}&colour=red")
    assert bad.status == 400 and "unknown parameter 'colour'" in bad.doc["error"]
    assert call(p.url, "GET", "/v1/queries/jobs?module=dev.example.other").doc == []


def test_the_reference_modules_overview_shows_its_backlog(start_portal: Any) -> None:
    p = start_portal()
    alice = submitter_token(p.db, "alice")
    submit(p, alice, [job(f"{i}") for i in range(7)])
    Node(p, "n1").claim(offer(free=2))
    view = call(p.url, "GET", f"/modules/{MODULE_ID}/pages/overview?format=json").doc
    shown = {c["id"]: c["value"]["text"] for c in view["components"].values()
             if c.get("id", "").startswith("jobs-")}
    assert shown == {"jobs-queued": "5", "jobs-running": "2"}
