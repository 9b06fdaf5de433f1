"""The pure service state machine: no processes."""

from __future__ import annotations

import pytest

from oarbank_agent.services import lifecycle as lc


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


# --- every input of a decision lives in the state ------------------------------------------

def ready(s: lc.ServiceState, now: float = 0.0) -> lc.ServiceState:
    return lc.apply(lc.apply(s, lc.Event.START, now), lc.Event.READY, now)


def test_every_row_of_the_table_and_the_failure_branch() -> None:
    for (state, event), row in lc.TRANSITIONS.items():
        s = lc.ServiceState("on_demand", 10.0, 10.0, 600.0, 3, state=state)
        if isinstance(row, lc.Branch):
            assert lc.target(s, event) is row.otherwise  # the first failure backs off
            last = lc.ServiceState("on_demand", 10.0, 10.0, 600.0, 3, state=state, failures=2)
            assert lc.target(last, event) is row.then is lc.State.WITHDRAWN
            assert lc.apply(last, event, 0).state is lc.State.WITHDRAWN
        else:
            assert lc.target(s, event) is row
            assert lc.apply(s, event, 0).state is row


def test_everything_not_in_the_table_is_refused() -> None:
    for state in lc.State:
        for event in lc.Event:
            if (state, event) in lc.TRANSITIONS:
                continue
            s = lc.ServiceState("on_demand", 10.0, 10.0, 600.0, 3, state=state)
            with pytest.raises(lc.IllegalTransition):
                lc.apply(s, event, 0)


def test_a_held_service_is_never_started_a_ready_one_stops_and_a_start_is_cancelled() -> None:
    wanted = lc.set_users(svc(), 1, 0)
    held = lc.set_held(wanted, "preempt_memory")
    assert lc.decide(wanted, 0).action == "start"
    assert lc.decide(held, 0) == lc.Decision()
    assert lc.decide(lc.set_held(ready(wanted), "preempt_protection"), 0) == \
        lc.Decision("stop", reason="preempt_protection")
    starting = lc.apply(held, lc.Event.START, 0)
    assert lc.decide(starting, 0) == lc.Decision("cancel", reason="preempt_memory")
    assert lc.decide(lc.apply(wanted, lc.Event.START, 0), 0) == lc.Decision()  # not held
    # Lifted: it starts again.
    assert lc.decide(lc.set_held(held, None), 0).action == "start"
    # A hold keeps its pools at 0 and nobody waits for it.
    assert lc.offered(wanted) and not lc.offered(held)
    assert not lc.hopeless(wanted) and lc.hopeless(held)


def test_a_service_whose_gpu_api_is_missing_is_never_started() -> None:
    s = lc.set_gpu_missing(lc.set_users(svc("always"), 1, 0), "GPU_API_MISSING: needs cuda")
    assert lc.decide(s, 0) == lc.Decision()
    assert not lc.offered(s) and lc.hopeless(s)
    assert lc.decide(lc.set_gpu_missing(s, None), 0).action == "start"


def test_shutdown_is_in_the_state_and_comes_before_holds() -> None:
    up = ready(lc.set_users(svc(), 1, 0))
    down = lc.shut_down(up)
    assert lc.decide(down, 0) == lc.Decision("stop", reason="shutdown")
    assert lc.decide(up, 0, shutting_down=True) == lc.decide(down, 0)
    assert lc.decide(lc.set_held(down, "preempt_memory"), 0) == \
        lc.Decision("stop", reason="shutdown")
    failed = lc.apply(lc.apply(lc.set_users(svc(), 1, 0), lc.Event.START, 0), lc.Event.FAILED, 0)
    assert lc.decide(lc.shut_down(failed), 0).action == "forget"
    assert lc.hopeless(down) and lc.offered(down)  # its pools still count while it stops


def test_fault_no_idle_stop_keeps_an_idle_service_up_without_a_timer() -> None:
    idle = lc.set_users(ready(lc.set_users(svc(), 1, 0)), 0, 5)
    assert lc.decide(idle, 15) == lc.Decision("stop", reason="idle")
    broken = lc.with_faults(idle, idle_stop=False)
    assert lc.decide(broken, 15) == lc.Decision()  # due: nothing, and no further wake-up
    assert lc.decide(broken, 6) == lc.Decision(wake_at=15)
    # Holds and shutdown still stop it.
    assert lc.decide(lc.set_held(broken, "preempt_memory"), 15).action == "stop"
    assert lc.decide(lc.shut_down(broken), 15) == lc.Decision("stop", reason="shutdown")


def test_fault_flat_backoff_never_grows_the_delay() -> None:
    s = lc.with_faults(lc.set_users(svc(max_failures=9), 1, 0), flat_backoff=True)
    for n in range(1, 5):
        s = lc.apply(lc.apply(s, lc.Event.START, 100 * n), lc.Event.FAILED, 100 * n)
        assert (s.failures, s.retry_at) == (n, 100 * n + 10)
    w = lc.with_faults(lc.set_users(svc(max_failures=2), 1, 0), flat_backoff=True)
    for _ in range(2):
        w = lc.apply(lc.apply(w, lc.Event.START, 0), lc.Event.FAILED, 0)
    assert w.state is lc.State.WITHDRAWN
    assert lc.apply(w, lc.Event.PROBED, 50).retry_at == 60


def test_withdrawn_services_offer_nothing_and_nobody_waits_for_them() -> None:
    s = lc.set_users(svc(max_failures=1), 1, 0)
    s = lc.apply(lc.apply(s, lc.Event.START, 0), lc.Event.FAILED, 0)
    assert s.state is lc.State.WITHDRAWN
    assert not lc.offered(s) and lc.hopeless(s)
    assert lc.hopeless(svc("manual")) and lc.offered(svc("manual"))
