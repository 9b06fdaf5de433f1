"""The connector's decision for one connect, pure: no sockets, no loop, no clock."""

from __future__ import annotations

from oarbank_agent.broker.connector import CONNECTOR_MAX_UNRECEIVED, Verdict, decide
from oarbank_agent.broker.ratelimit import TokenBucket


def never_asked() -> bool:
    raise AssertionError("readiness must not be asked for a refused or queued-behind connect")


def test_ready_and_nothing_ahead_hands_over_at_once() -> None:
    b = TokenBucket(4, 1.0, now=0.0)
    assert decide(unreceived=0, bucket=b, now=0.0, queued=False, ready_now=lambda: True) == \
        Verdict("hand_over")
    assert b.tokens(0.0) == 3  # one token spent


def test_not_ready_or_something_ahead_queues() -> None:
    b = TokenBucket(4, 1.0, now=0.0)
    assert decide(unreceived=0, bucket=b, now=0.0, queued=False,
                  ready_now=lambda: False) == Verdict("queue")
    # In order: behind a queued connect even a ready service waits its turn (not asked).
    assert decide(unreceived=0, bucket=b, now=0.0, queued=True,
                  ready_now=never_asked) == Verdict("queue")
    assert b.tokens(0.0) == 2


def test_the_unreceived_cap_refuses_first_and_spends_no_token() -> None:
    b = TokenBucket(4, 1.0, now=0.0)
    v = decide(unreceived=CONNECTOR_MAX_UNRECEIVED, bucket=b, now=0.0, queued=False,
               ready_now=never_asked)
    assert (v.action, v.code) == ("refuse", "rate_limited")
    assert v.detail is not None and f"{CONNECTOR_MAX_UNRECEIVED} connections" in v.detail
    assert b.tokens(0.0) == 4
    assert decide(unreceived=CONNECTOR_MAX_UNRECEIVED - 1, bucket=b, now=0.0, queued=False,
                  ready_now=lambda: True).action == "hand_over"


def test_the_rate_limit_refuses_with_the_time_to_the_next_token() -> None:
    b = TokenBucket(2, 4.0, now=10.0)
    for _ in range(2):
        assert decide(unreceived=0, bucket=b, now=10.0, queued=False,
                      ready_now=lambda: True).action == "hand_over"
    v = decide(unreceived=0, bucket=b, now=10.0, queued=False, ready_now=never_asked)
    assert (v.action, v.code) == ("refuse", "rate_limited")
    assert v.detail == ("over 2 connects at once or 4 a second on this connector; "
                        "retry in 0.250 s")
    # A quarter of a second later one token is back.
    assert decide(unreceived=0, bucket=b, now=10.25, queued=False,
                  ready_now=lambda: True).action == "hand_over"
