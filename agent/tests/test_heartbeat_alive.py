"""What the next heartbeat says (reporting/alive.py): whole or still-alive, and how long a
portal's Retry-After is honoured. Pure decisions; the real agent against a real portal is in
test_portal_backpressure.py."""

from __future__ import annotations

import random

from oarbank_agent.reporting.alive import AliveState, retry_after_s

DIGEST = "ab" * 32


def report(t: float, users: int = 0, mem: int = 1) -> dict:
    return {"node_id": "n", "hostname": "h", "time": t, "heartbeat_s": 10.0,
            "metrics": {"mem_used_bytes": mem},
            "services": [{"service": "s", "users": users, "rss_bytes": mem}]}


def test_still_alive_only_after_the_portal_offered_it_and_whole_every_n() -> None:
    a = AliveState(full_every=3)
    assert "services" in a.body(report(1))
    a.answered({"ok": True})  # an older portal: no "alive" in its answer
    assert "services" in a.body(report(2))
    a.answered({"ok": True, "alive": DIGEST})
    sent = [a.body(report(3 + i, mem=i)) for i in range(1)]
    a.answered({"alive": DIGEST})
    sent.append(a.body(report(10, mem=7)))
    a.answered({"alive": DIGEST})
    sent.append(a.body(report(11)))  # the third in a row goes whole
    assert [("alive" in b, "services" in b) for b in sent] == [
        (True, False), (True, False), (False, True)]
    assert sent[0] == {"node_id": "n", "hostname": "h", "time": 3, "heartbeat_s": 10.0,
                       "alive": DIGEST}


def test_a_change_or_a_failure_sends_the_whole_snapshot() -> None:
    a = AliveState()
    a.body(report(1))
    a.answered({"alive": DIGEST})
    assert "services" in a.body(report(2, users=1))  # a change of state: whole at once
    a.answered({"alive": "cd" * 32})
    assert a.body(report(3, users=1))["alive"] == "cd" * 32
    a.forget()  # the post failed or was refused
    assert "services" in a.body(report(4, users=1))


def test_retry_after_with_jitter() -> None:
    rng = random.Random(7)
    waits = [retry_after_s("4", rng) for _ in range(200)]
    assert all(w is not None and 4.0 <= w <= 6.0 for w in waits)
    assert max(waits) - min(waits) > 1.0  # spread, not all at once
    assert retry_after_s(None) is None
    assert retry_after_s("Wed, 21 Oct 2026 07:28:00 GMT") is None  # a date: ordinary backoff
    assert 3600.0 <= (retry_after_s("999999", rng) or 0) <= 5400.0  # capped at an hour
