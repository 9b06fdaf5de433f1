"""Reading fingerprint answers: an unusable one offers nothing and says why."""

from __future__ import annotations

import pytest

from oarbank_agent.services.fingerprint import parse

GOOD = {"service_protocol": {"supported": [1]}, "health": "healthy", "pools": {"model": 4},
        "reserve": {"mem_gb": 0.5}, "running": True}


def test_a_good_fingerprint_offers_its_pools() -> None:
    fp = parse(GOOD)
    assert (fp.health, fp.pools, fp.running, fp.reserve_gb, fp.problem) == (
        "healthy", {"model": 4}, True, 0.5, None)


@pytest.mark.parametrize("proto", [None, {}, {"supported": []}, {"supported": [2]},
                                   {"supported": [True]}, {"supported": "1"}])
def test_a_service_that_does_not_speak_protocol_1_offers_nothing(proto: object) -> None:
    doc = dict(GOOD, service_protocol=proto)
    fp = parse(doc)
    assert (fp.health, fp.pools) == ("unhealthy", {})
    assert "service_protocol.supported is" in (fp.problem or "")
    assert 'it must list 1 (answer "service_protocol": {"supported": [1]})' in (fp.problem or "")


def test_unhealthy_or_unknown_health_offers_nothing() -> None:
    assert parse(dict(GOOD, health="unhealthy")).pools == {}
    odd = parse(dict(GOOD, health="great"))
    assert (odd.health, odd.pools) == ("unhealthy", {})
    assert "health 'great'" in (odd.problem or "")


def test_bad_counts_are_dropped_not_fatal() -> None:
    fp = parse(dict(GOOD, pools={"a": -1, "b": True, "c": 2.5, "d": 3}))
    assert (fp.pools, fp.reserve_gb) == ({"d": 3}, 0.5)


def test_gpu_memory_may_be_reserved() -> None:
    fp = parse(dict(GOOD, reserve={"mem_gb": 0.5, "gpu_mem_gb": 6}))
    assert (fp.reserve_gb, fp.reserve_gpu_gb, fp.problem) == (0.5, 6.0, None)
    assert parse(dict(GOOD, reserve={})).reserve_gb == 0.0


@pytest.mark.parametrize(("reserve", "problem"), [
    ({"mem_tb": 1}, "fingerprint: reserve.mem_tb: unknown unit (this agent knows mem_gb, "
                    "gpu_mem_gb)"),
    ({"mem_gb": -1}, "fingerprint: reserve.mem_gb: must be a number >= 0 (GB), got -1"),
    ({"gpu_mem_gb": -0.5}, "fingerprint: reserve.gpu_mem_gb: must be a number >= 0 (GB), "
                           "got -0.5"),
    ({"mem_gb": "x"}, "fingerprint: reserve.mem_gb: must be a number >= 0 (GB), got 'x'"),
    ({"mem_gb": True}, "fingerprint: reserve.mem_gb: must be a number >= 0 (GB), got True"),
    ([0.5], "fingerprint: reserve must be an object, got list"),
])
def test_a_reserve_it_cannot_account_offers_nothing_and_names_the_key(
        reserve: object, problem: str) -> None:
    fp = parse(dict(GOOD, reserve=reserve))
    assert (fp.health, fp.pools, fp.reserve_gb, fp.problem) == ("unhealthy", {}, 0.0, problem)
    assert fp.reserve_problem == problem  # at load: its module is refused
    # a wrong protocol is the problem shown first; the reserve still refuses the module
    both = parse(dict(GOOD, reserve=reserve, service_protocol={"supported": [2]}))
    assert "service_protocol.supported is" in (both.problem or "")
    assert both.reserve_problem == problem


def test_a_good_reserve_is_no_problem() -> None:
    assert parse(GOOD).reserve_problem is None
    assert parse(dict(GOOD, reserve=None)).reserve_problem is None
