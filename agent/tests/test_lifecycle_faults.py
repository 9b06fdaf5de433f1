"""The pure machine's fault rows: withdrawal probes, un-withdrawal, adoption after a restart."""

from __future__ import annotations

import pytest

from oarbank_agent.services import lifecycle as lc


def svc(lifecycle: str = "on_demand", **kw: object) -> lc.ServiceState:
    base = dict(idle_timeout_s=10.0, backoff_initial_s=1.0, backoff_max_s=4.0, max_failures=2)
    base.update(kw)
    return lc.ServiceState(lifecycle, **base)  # type: ignore[arg-type]


def withdrawn(now: float = 0.0) -> lc.ServiceState:
    s = lc.set_users(svc(), 1, now)
    for _ in range(2):
        s = lc.apply(lc.apply(s, lc.Event.START, now), lc.Event.FAILED, now, error="boom")
    return s


def test_withdrawn_is_probed_after_the_backoff_and_recovers_keeping_its_failures() -> None:
    s = withdrawn()
    assert (s.state, s.failures, s.retry_at, s.error) == (lc.State.WITHDRAWN, 2, 2.0, "boom")
    assert lc.decide(s, 1.0) == lc.Decision(wake_at=2.0)
    assert lc.decide(s, 2.0).action == "probe"
    assert lc.decide(s, 2.0, shutting_down=True).action == "none"
    # An unhealthy fingerprint: probe again one backoff later, still withdrawn.
    again = lc.apply(s, lc.Event.PROBED, 2.0)
    assert (again.state, again.retry_at) == (lc.State.WITHDRAWN, 4.0)
    # A healthy one: stopped, may start again, but the count is kept: one more failure
    # withdraws it at once; only READY resets it.
    back = lc.apply(again, lc.Event.RECOVER, 4.0)
    assert (back.state, back.failures, back.error) == (lc.State.STOPPED, 2, "boom")
    assert lc.decide(back, 4.0).action == "start"
    failed = lc.apply(lc.apply(back, lc.Event.START, 4), lc.Event.FAILED, 5, error="again")
    assert failed.state is lc.State.WITHDRAWN
    ok = lc.apply(lc.apply(back, lc.Event.START, 4), lc.Event.READY, 5)
    assert (ok.state, ok.failures, ok.error) == (lc.State.READY, 0, None)


def test_withdrawn_probes_even_without_users_so_its_pools_can_return() -> None:
    s = lc.set_users(withdrawn(), 0, 1.0)
    assert lc.decide(s, 3.0).action == "probe"


def test_adopt_only_from_stopped_and_an_adopted_service_idles_out() -> None:
    s = lc.apply(svc(), lc.Event.ADOPT, 100.0)
    assert s.state is lc.State.READY and s.idle_since == 100.0
    assert lc.decide(s, 110.0) == lc.Decision("stop", reason="idle")
    with pytest.raises(lc.IllegalTransition):
        lc.apply(s, lc.Event.ADOPT, 0)
    with pytest.raises(lc.IllegalTransition):
        lc.apply(withdrawn(), lc.Event.ADOPT, 0)


def test_manual_is_never_started_stopped_or_probed() -> None:
    m = lc.set_users(svc("manual"), 2, 0)
    assert lc.decide(m, 0) == lc.Decision()
    assert lc.decide(m, 1e9, shutting_down=True) == lc.Decision()
