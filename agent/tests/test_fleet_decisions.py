"""Fleet dispatch's pure decisions on the node (fleet/offer.py, fleet/answers.py), row by row:
how many grants a claim asks for, what it says, and what each portal answer means."""

from __future__ import annotations

import json
import random

import pytest

from oarbank_agent.fleet import answers, offer
from oarbank_agent.fleet.offer import ModuleView, NodeView, ServiceView

M = "dev.example.modelserver"


def node(*services: ServiceView, free: float | None = 8.0, evictable: float | None = 0.0,
         waiting: int = 0, stopping: bool = False, poolless: tuple[str, ...] = ()) -> NodeView:
    return NodeView("n1", (ModuleView(M, ("generate", *poolless), services, 0.8, poolless),),
                    free, evictable, (), waiting, stopping)


def svc(state: str, free: int = 2, total: int = 2, mem_gb: float | None = 6.0) -> ServiceView:
    return ServiceView("model", state, {"model": (free, total)}, 1.5, mem_gb)


@pytest.mark.parametrize("view,expected", [
    (node(svc("ready")), 2),  # a warm service's free tokens
    (node(svc("starting", free=1)), 1),
    (node(svc("ready", free=0)), 0),  # every token held or asked for here: no claim
    (node(svc("stopped"), free=8.0), 2),  # a cold copy fits the free memory
    (node(svc("stopped"), free=4.0, evictable=0.0), 0),  # 6 GB does not fit 4
    (node(svc("stopped"), free=4.0, evictable=2.0), 2),  # ... with what eviction frees, it does
    (node(svc("stopped"), free=None), 2),  # memory unknown: fits
    (node(svc("stopped", mem_gb=None), free=0.0), 2),  # reserves nothing
    (node(svc("ready"), stopping=True), 0),  # a draining node claims nothing
    (node(svc("ready", free=0), poolless=("index",)), 1),  # a poolless stage: one at a time
    (node(svc("ready", free=0), poolless=("index",), waiting=1), 0),  # ... while none waits
    (NodeView("n1"), 0),  # no module
])
def test_room(view: NodeView, expected: int) -> None:
    assert offer.room(view) == expected


def test_room_is_bounded_by_the_portals_limit() -> None:
    assert offer.room(node(svc("ready", free=5000, total=5000))) == offer.MAX_GRANTS


def test_the_claim_says_what_the_node_can_take_in_the_contracts_fields() -> None:
    view = NodeView("n1", (ModuleView(M, ("generate",), (svc("ready", 1, 2),), 0.81234),),
                    10.5, 6.0, ({"index": 0, "mem_used_gb": 1.0, "mem_total_gb": 80.0},))
    assert offer.claim_body(view, 20, 1) == {
        "node_id": "n1", "wait_s": 20, "max_grants": 1, "free_mem_gb": 10.5,
        "evictable_mem_gb": 6.0,
        "gpus": [{"index": 0, "mem_used_gb": 1.0, "mem_total_gb": 80.0}],
        "modules": [{"module": M, "stages": ["generate"], "services": [
            {"service": "model", "state": "ready", "pools": {"model": {"free": 1, "total": 2}},
             "load_s": 1.5, "job_s": 0.812, "mem_gb": 6.0}]}]}


def test_job_times_are_the_mean_of_the_last_ones_kept() -> None:
    t = offer.JobTimes(kept=3)
    assert t.mean(M) is None
    for s in (10.0, 1.0, 2.0, 3.0):
        t.add(M, s)
    assert t.mean(M) == 2.0 and t.mean("other") is None


GRANT = {"attempt_id": 17, "job_id": "J1", "generation": 2, "module": M, "stage": "generate",
         "payload": {"prompts": ["a"]}, "placement": "ready", "issued_at": 1.0,
         "expires_at": 61.0}


@pytest.mark.parametrize("bad,problem", [
    ({"attempt_id": 0}, "grants[0].attempt_id: not a whole number >= 1"),
    ({"generation": True}, "grants[0].generation: not a whole number >= 1"),
    ({"job_id": None}, "grants[0].job_id: not text"),
    ({"stage": ""}, "grants[0].stage: not text"),
    ({"payload": [1]}, "grants[0].payload: not an object"),
])
def test_a_grant_that_is_not_one_is_named_and_the_others_run(bad: dict[str, object],
                                                             problem: str) -> None:
    grants, problems, renew_s = answers.read_grants(
        {"grants": [GRANT | bad, GRANT | {"attempt_id": 18}], "renew_s": 1.0})
    assert [g.attempt_id for g in grants] == [18] and renew_s == 1.0
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_a_grant_keeps_what_the_record_needs() -> None:
    (g,), problems, renew_s = answers.read_grants({"grants": [GRANT]})
    assert problems == [] and renew_s is None
    assert g.portal() == {"job_id": "J1", "attempt_id": 17, "generation": 2,
                          "placement": "ready", "report": None}
    assert g.expires_at == 61.0
    assert answers.read_grants({"now": 1}) == ([], ["the answer has no grants list"], None)


def test_lost_attempts_and_their_reasons() -> None:
    doc = {"renewed": [{"attempt_id": 1, "expires_at": 9.0}],
           "lost": [{"attempt_id": 2, "error": "stale_generation"},
                    {"attempt_id": 3, "error": "cancelled"}, {"attempt_id": "x"}]}
    assert answers.read_lost(doc) == {2: "stale_generation", 3: "cancelled"}
    assert answers.read_lost(None) == {}


def _body(error: str) -> bytes:
    return json.dumps({"error": error, "detail": "why"}).encode()


@pytest.mark.parametrize("status,body,outcome,why", [
    (200, b'{"accepted": true}', "accepted", ""),
    (409, _body("lease_lost"), "refused", "lease_lost"),
    (409, _body("stale_generation"), "refused", "stale_generation"),
    (409, _body("cancelled"), "refused", "cancelled"),
    (409, _body("not_your_attempt"), "refused", "not_your_attempt"),
    (400, _body("bad_request"), "refused", "HTTP 400: bad_request: why"),  # the same again
    (413, b"too big", "refused", "HTTP 413: too big"),
    (503, _body("unavailable"), "retry", "HTTP 503: unavailable: why"),
    (429, b"", "retry", "HTTP 429: (no body)"),
    (401, _body("unauthenticated"), "retry", "HTTP 401: unauthenticated: why"),
    (502, b"<html>bad gateway</html>", "retry", "HTTP 502: <html>bad gateway</html>"),
])
def test_what_a_results_answer_means(status: int, body: bytes, outcome: str, why: str) -> None:
    assert answers.result_verdict(status, body) == answers.Verdict(outcome, why)


def test_backoff_doubles_to_its_bound_with_up_to_half_again_of_jitter() -> None:
    rng = random.Random(7)
    base: float | None = None
    bases = []
    for _ in range(10):
        wait, base = answers.backoff(base, rng)
        assert base <= wait <= base * 1.5
        bases.append(base)
    assert bases[:4] == [0.5, 1.0, 2.0, 4.0] and bases[-1] == answers.BACKOFF_MAX_S


def test_a_result_is_the_record_and_its_envelope_and_one_over_the_limit_goes_without_it(
        ) -> None:
    from oarbank_agent.fleet.results import MAX_BODY, result_body
    from oarbank_agent.jobs.store import JobRecord

    grant = {"job_id": "J1", "attempt_id": 17, "generation": 2, "report": None}
    rec = JobRecord("j1", M, "generate", {"prompts": ["a"]}, state="succeeded", attempts=1,
                    result={"payload": {"texts": ["a"]}}, portal=grant)
    doc = json.loads(result_body("n1", rec))
    assert (doc["node_id"], doc["attempt_id"], doc["generation"]) == ("n1", 17, 2)
    assert doc["result"] == {"payload": {"texts": ["a"]}}
    assert doc["record"]["job_id"] == "j1" and doc["record"]["state"] == "succeeded"
    assert "portal" not in doc["record"] and "result" not in doc["record"]
    rec.result = {"payload": {"texts": ["a" * MAX_BODY]}}
    body = result_body("n1", rec)
    doc = json.loads(body)
    assert len(body) < MAX_BODY and doc["result"] is None
    assert doc["record"]["result_omitted"].startswith("the result envelope made the report")
    assert doc["record"]["state"] == "succeeded"


def test_a_claim_carries_results_as_their_bodies_are() -> None:
    claim = {"node_id": "n1", "wait_s": 20, "modules": []}
    assert offer.claim_bytes(claim, []) == json.dumps(claim, separators=(",", ":")).encode()
    r1, r2 = b'{"attempt_id":1,"generation":1}', b'{"attempt_id":2,"generation":3}'
    doc = json.loads(offer.claim_bytes(claim, [r1, r2]))
    assert doc == {**claim, "results": [json.loads(r1), json.loads(r2)]}


@pytest.mark.parametrize(("doc", "want"), [
    # each answered as a post would be, in the order sent
    ({"grants": [], "results": [
        {"attempt_id": 1, "status": 200, "accepted": True},
        {"attempt_id": 2, "status": 409, "error": "stale_generation", "detail": "..."},
        {"status": 400, "error": "bad_request", "detail": "results[2].generation: ..."},
        {"attempt_id": 4, "status": 503, "error": "unavailable"}]},
     [("accepted", ""), ("refused", "stale_generation"),
      ("refused", "HTTP 400: bad_request: results[2].generation: ..."),
      ("retry", "HTTP 503: unavailable")]),
    # an item that is no answer: sent again
    ({"results": [{"attempt_id": 1, "status": 200}, {"attempt_id": 2}, 7, {"status": True}]},
     [("accepted", ""), ("retry", None), ("retry", None), ("retry", None)]),
])
def test_a_claims_answer_settles_each_result_it_carried(doc: object,
                                                        want: list[tuple[str, str | None]]
                                                        ) -> None:
    got = answers.carried_verdicts(doc, len(want))
    assert got is not None
    assert [v.outcome for v in got] == [o for o, _ in want]
    for v, (_, why) in zip(got, want, strict=True):
        if why is not None:
            assert v.why == why


@pytest.mark.parametrize("doc", [
    {"grants": []},  # a portal that does not take results with claims (unknown keys ignored)
    {"grants": [], "results": [{"status": 200}]},  # not one answer per result
    {"grants": [], "results": "accepted"}, None, [1, 2, 3],
])
def test_a_claims_answer_that_says_nothing_of_its_results_leaves_them_owed(doc: object) -> None:
    assert answers.carried_verdicts(doc, 3 if isinstance(doc, list) else 2) is None
