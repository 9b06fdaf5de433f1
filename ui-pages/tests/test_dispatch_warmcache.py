"""The warmth a claim reads (contract 10.5, ``warm_tokens``, the fleet's ``job_s`` and
``load_s``) from one process's cached read of the nodes' offers: the same answer as summing
the offers afresh, the claiming node's own left out, its new claims seen at once."""

from __future__ import annotations

import random

from oarbank_ui.dispatch.offers import Warmth
from oarbank_ui.dispatch.warmcache import Offer, WarmCache

M, N = "dev.example.a", "dev.example.b"


def row(node: str, state: str, tokens: int = 4, job_s: float | None = None,
        load_s: float | None = None, module: str = M) -> dict[str, object]:
    return {"node_id": node, "module": module, "service": "model", "state": state,
            "tokens": tokens, "job_s": job_s, "load_s": load_s}


def afresh(rows: list[dict[str, object]], node: str, module: str = M) -> Warmth | None:
    """What a read summing every other node's offer says (the reference)."""
    mine = [r for r in rows if r["node_id"] != node and r["module"] == module]
    if not mine:
        return None
    jobs = [float(r["job_s"]) for r in mine if r["job_s"] is not None]  # type: ignore[arg-type]
    loads = [float(r["load_s"]) for r in mine if r["load_s"] is not None]  # type: ignore[arg-type]
    return Warmth(sum(int(r["tokens"]) for r in mine if r["state"] in ("ready", "starting")),  # type: ignore[call-overload]
                  sum(int(r["tokens"]) for r in mine if r["state"] == "starting"),  # type: ignore[call-overload]
                  sum(jobs) / len(jobs) if jobs else None,
                  sum(loads) / len(loads) if loads else None)


def test_a_claim_reads_the_other_nodes_and_not_its_own() -> None:
    rows = [row("n1", "ready", 4, 2.0, 30.0), row("n2", "starting", 2, None, 40.0),
            row("n3", "stopped", 4, 6.0), row("n4", "ready", 8, module=N)]
    c = WarmCache()
    c.fill(rows, [M, N], 0.0)
    assert c.warmth("n1", [M]) == {(M, "model"): Warmth(2, 2, 6.0, 40.0)}
    assert c.warmth("n9", [M]) == {(M, "model"): Warmth(6, 2, 4.0, 35.0)}
    assert c.warmth("n4", [N]) == {}  # nobody else offers it
    assert c.warmth("n1", [M, N])[(N, "model")] == Warmth(8, 0, None, None)


def test_a_claim_recorded_here_replaces_the_nodes_offer_at_once() -> None:
    c = WarmCache()
    c.fill([row("n1", "stopped"), row("n2", "ready")], [M], 0.0)
    c.record("n1", {(M, "model"): Offer("starting", 4, None, 30.0)})
    assert c.warmth("n2", [M]) == {(M, "model"): Warmth(4, 4, None, 30.0)}
    c.record("n1", {})  # offers nothing now
    assert c.warmth("n2", [M]) == {}
    assert c.warmth("n3", [M]) == {(M, "model"): Warmth(4, 0, None, None)}


def test_the_cache_answers_for_its_ttl_and_the_modules_it_read() -> None:
    c = WarmCache(ttl_s=0.1)
    assert not c.covers([M], 0.0)
    c.fill([], [M], 10.0)
    assert c.covers([M], 10.05) and not c.covers([M], 10.2) and not c.covers([M, N], 10.05)
    c.forget()
    assert not c.covers([M], 10.0)


def test_many_claims_read_what_summing_afresh_would() -> None:
    rnd = random.Random(7)
    nodes = [f"n{i}" for i in range(40)]

    def offer() -> Offer:
        return Offer(rnd.choice(["ready", "starting", "stopped"]), rnd.choice([1, 2, 4]),
                     rnd.choice([None, rnd.uniform(1, 30)]), rnd.choice([None, rnd.uniform(5, 120)]))

    table = {n: offer() for n in nodes}
    c = WarmCache()
    c.fill([row(n, o.state, o.tokens, o.job_s, o.load_s) for n, o in table.items()], [M], 0.0)
    for _ in range(500):
        n = rnd.choice(nodes)
        if rnd.random() < 0.5:
            table[n] = offer()
            c.record(n, {(M, "model"): table[n]})
        reader = rnd.choice(nodes)
        want = afresh([row(k, o.state, o.tokens, o.job_s, o.load_s) for k, o in table.items()],
                      reader)
        got = c.warmth(reader, [M]).get((M, "model"))
        assert want is not None and got is not None
        assert (got.tokens, got.starting) == (want.tokens, want.starting)
        for a, b in ((got.job_s, want.job_s), (got.load_s, want.load_s)):
            assert (a is None) == (b is None) and (a is None or abs(a - b) < 1e-6), (a, b)  # type: ignore[operator]
