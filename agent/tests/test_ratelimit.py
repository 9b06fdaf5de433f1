"""The connector rate limit as pure logic: a burst, then a steady refill (no clock, no sleep)."""

from __future__ import annotations

import pytest

from oarbank_agent.broker.ratelimit import TokenBucket


def test_burst_then_steady_rate():
    bucket = TokenBucket(64, 32.0, now=100.0)
    assert all(bucket.take(100.0) for _ in range(64))
    assert not bucket.take(100.0)
    assert bucket.retry_after(100.0) == pytest.approx(1 / 32)
    # One second later: 32 more, not 64.
    assert sum(bucket.take(101.0) for _ in range(100)) == 32
    # Refill never passes the burst.
    assert sum(bucket.take(1000.0) for _ in range(100)) == 64


def test_a_refused_take_costs_nothing_and_the_clock_going_back_refills_nothing():
    bucket = TokenBucket(1, 2.0, now=0.0)
    assert bucket.take(0.0)
    assert not bucket.take(0.25)
    assert bucket.take(0.5)
    assert not bucket.take(0.4)
    assert bucket.retry_after(0.4) == pytest.approx(0.5)


@pytest.mark.parametrize(("burst", "rate"), [(0, 1.0), (1, 0.0), (1, -3.0)])
def test_nonsense_settings_are_rejected(burst, rate):
    with pytest.raises(ValueError):
        TokenBucket(burst, rate, now=0.0)
