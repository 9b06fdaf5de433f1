"""The pure service state machine and the pure admission: no processes."""

from __future__ import annotations

import pytest

from oarbank_agent import lifecycle as lc
from oarbank_agent.admission import Admission, Request


def svc(lifecycle: str = "on_demand", **kw: object) -> lc.ServiceState:
    base = dict(idle_timeout_s=10.0, backoff_initial_s=10.0, backoff_max_s=600.0, max_failures=5)
    base.update(kw)
    return lc.ServiceState(lifecycle, **base)  # type: ignore[arg-type]


def test_backoff_delay_doubles_and_caps() -> None:
    assert [lc.backoff_delay(n, 10, 600) for n in range(1, 9)] == \
        [10, 20, 40, 80, 160, 320, 600, 600]
    assert lc.backoff_delay(10_000, 10, 600) == 600


def test_on_demand_starts_for_a_user_and_idles_out() -> None:
    s = svc()
    assert lc.decide(s, 0).action == "none"
    s = lc.set_users(s, 1, 0)
    assert lc.decide(s, 0).action == "start"
    s = lc.apply(lc.apply(s, lc.Event.START, 0), lc.Event.READY, 1)
    assert lc.decide(s, 1) == lc.Decision()
    s = lc.set_users(s, 0, 5)
    d = lc.decide(s, 6)
    assert d.action == "none" and d.wake_at == 15
    assert lc.decide(s, 15) == lc.Decision("stop", reason="idle")
    s = lc.set_users(s, 1, 14)  # a user arrives before the timer: no stop
    assert lc.decide(s, 20).action == "none"


def test_always_and_manual() -> None:
    assert lc.decide(svc("always"), 0).action == "start"
    up = lc.apply(lc.apply(svc("always"), lc.Event.START, 0), lc.Event.READY, 0)
    assert lc.decide(up, 10_000).action == "none"  # never idle-stopped
    assert lc.decide(lc.set_users(svc("manual"), 3, 0), 0).action == "none"


def test_failures_back_off_then_withdraw_and_only_ready_resets() -> None:
    s = lc.set_users(svc(max_failures=3), 1, 0)
    s = lc.apply(lc.apply(s, lc.Event.START, 0), lc.Event.FAILED, 0, error="boom")
    assert (s.state, s.failures, s.retry_at, s.error) == (lc.State.BACKOFF, 1, 10, "boom")
    assert lc.decide(s, 5) == lc.Decision(wake_at=10)
    assert lc.decide(s, 10).action == "start"
    s = lc.apply(lc.apply(s, lc.Event.START, 10), lc.Event.FAILED, 10)
    assert (s.state, s.retry_at) == (lc.State.BACKOFF, 30)
    # A clean stop does not reset the count; becoming ready does.
    ready = lc.apply(lc.apply(s, lc.Event.START, 30), lc.Event.READY, 31)
    assert ready.failures == 0 and ready.error is None
    s = lc.apply(lc.apply(s, lc.Event.START, 30), lc.Event.FAILED, 30)
    assert s.state is lc.State.WITHDRAWN and lc.decide(s, 30) == lc.Decision(wake_at=70)


def test_backoff_is_kept_when_no_one_wants_it_and_forgotten_at_shutdown() -> None:
    s = lc.set_users(svc(), 1, 0)
    s = lc.apply(lc.apply(s, lc.Event.START, 0), lc.Event.FAILED, 0)
    idle = lc.set_users(s, 0, 1)
    assert lc.decide(idle, 100) == lc.Decision()
    assert lc.decide(lc.set_users(idle, 1, 2), 5).wake_at == 10  # still waits out the delay
    assert lc.decide(s, 0, shutting_down=True).action == "forget"


def test_illegal_transitions_are_refused() -> None:
    with pytest.raises(lc.IllegalTransition):
        lc.apply(svc(), lc.Event.READY, 0)
    with pytest.raises(lc.IllegalTransition):
        lc.apply(svc(), lc.Event.STOPPED, 0)


def test_admission_is_fifo_per_pool_without_overtaking() -> None:
    a = Admission()
    a.set_capacity("m/model", 2)
    a.set_capacity("m/other", 1)
    for job, pools in [("j1", {"m/model": 1}), ("j2", {"m/model": 2}), ("j3", {"m/model": 1}),
                       ("j4", {"m/other": 1}), ("j5", {})]:
        a.enqueue(Request(job, pools))
    # j2 cannot fit next to j1: it waits and j3 may not overtake it; other pools go ahead.
    assert [r.job_id for r in a.admit()] == ["j1", "j4", "j5"]
    assert a.waiting() == ["j2", "j3"]
    a.release("j1")
    assert [r.job_id for r in a.admit()] == ["j2"]
    a.release("j2")
    assert [r.job_id for r in a.admit()] == ["j3"]
    assert a.holders("m/model") == 1


def test_admission_needs_pools_and_zero_capacity() -> None:
    a = Admission()
    a.enqueue(Request("j1", {}, ("m/model",)))
    assert a.admit() == []  # the pool does not exist yet
    a.set_capacity("m/model", 1)
    assert [r.job_id for r in a.admit()] == ["j1"]
    assert a.in_use.get("m/model", 0) == 0  # needs_pools takes no token
