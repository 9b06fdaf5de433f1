"""``keep/decide.py``: a kept endpoint service is taken back only when every fact proves it
the same; each fact that fails is named as the reason it is stopped (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oarbank_agent.keep.decide import Now, decide
from oarbank_agent.keep.record import KeptService

KEPT = KeptService(key="m.x/model", module_id="m.x", version="1.2.0", settings_digest="s1",
                   manifest_digest="m1", group="4242", pid=4243, pid_started=99001,
                   says_ready=True, users=0, idle_since=1700000000.0)
SAME = Now(keeping=True, loaded=True, disabled=False, version="1.2.0", settings_digest="s1",
           manifest_digest="m1", group_alive=True, pid_in_group=True, pid_started=99001,
           end_present=True, end_open=True)


def test_the_same_service_is_taken_back() -> None:
    v = decide(KEPT, SAME)
    assert v.adopt and "pid 4243" in v.why and "1.2.0" in v.why


@pytest.mark.parametrize(("change", "why"), [
    ({"keeping": False}, "this agent runs without --keep-services"),
    ({"loaded": False}, "its module is no longer loaded here"),
    ({"disabled": True}, "its module is disabled"),
    ({"version": "1.3.0"}, "its module's version changed (1.2.0 -> 1.3.0)"),
    ({"manifest_digest": "m2"}, "its module's manifest changed"),
    ({"settings_digest": "s2"}, "its settings changed"),
    ({"end_present": False}, "its channel's end did not come back from the keeper"),
    ({"end_open": False}, "it closed its channel"),
    ({"group_alive": False}, "its process group is gone"),
    ({"pid_in_group": False}, "pid 4243 is no longer in its process group"),
    ({"pid_started": None}, "the system cannot say when its pid started"),
    ({"pid_started": 99002}, "pid 4243 is another process now"),
])
def test_each_fact_that_fails_stops_it_and_is_the_reason(change: dict[str, object],
                                                        why: str) -> None:
    v = decide(KEPT, replace(SAME, **change))  # type: ignore[arg-type]
    assert not v.adopt and v.why.startswith(why), v.why


def test_a_start_time_unknown_when_kept_proves_nothing() -> None:
    v = decide(replace(KEPT, pid_started=None), replace(SAME, pid_started=None))
    assert not v.adopt and "cannot be proven the same" in v.why


def test_a_record_survives_its_trip_through_the_keeper_and_a_bad_one_is_named() -> None:
    assert KeptService.from_doc(KEPT.to_doc()) == KEPT
    doc = KEPT.to_doc()
    del doc["pid"]
    with pytest.raises(ValueError, match="a kept record the agent cannot read"):
        KeptService.from_doc(doc)
