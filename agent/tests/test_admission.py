"""The pure admission: FIFO per pool, no overtaking, `needs_pools`; no processes."""

from __future__ import annotations

from oarbank_agent.jobs.admission import Admission, Request


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
