"""Attempt ids on the endpoint channel (contract section 3): integers, never reused, mapped to
the agent's job/attempt names in its log and in ``status``. A real agent, a real endpoint
service (the echo module records every ``connection`` it gets)."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import read_jsonl


def test_a_restarted_agent_numbers_attempts_after_its_predecessor(start_agent,  # type: ignore[no-untyped-def]
                                                                 echo_module: Path) -> None:
    first = start_agent([echo_module])
    a = first.run_job("echo", {"requests": 1})
    wa = first.wire_attempt(a["job_id"])
    assert f"attempt={a['job_id']}.1 (wire {wa})" in first.log()
    first.stop()
    second = start_agent([echo_module], state_dir=first.state_dir)
    b = second.run_job("echo", {"requests": 1})
    wb = second.wire_attempt(b["job_id"])
    assert wb > wa  # not 1 again: status never shows one number for two attempts
    assert f"attempt={b['job_id']}.1 (wire {wb})" in second.log()
    assert second.wire_attempt(a["job_id"]) == wa  # the earlier job keeps its number
    # The service saw exactly these integers, one connection each.
    seen = [e["attempt"] for e in read_jsonl(second.module_data() / "events.jsonl")
            if e["event"] == "connection"]
    assert seen == [wa, wb] and all(type(n) is int for n in seen)
