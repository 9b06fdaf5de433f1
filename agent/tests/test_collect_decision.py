"""The rule that decides, after an agent restart, whether an interrupted attempt finished
(``jobs/collect.py``): collected (its outcome recorded, nothing runs again) or run again.
Row by row; the last tests read real files through ``seen``."""

from __future__ import annotations

from pathlib import Path

import pytest

from oarbank_agent.jobs.collect import FAILURE_MAX_BYTES, Seen, decide, seen

OK = {"envelope": 1, "payload": {"texts": ["a"]}}
MISSING = Seen("missing")
TORN = Seen("unreadable", problem="unreadable (Expecting ',' delimiter)")


def parsed(doc: object) -> Seen:
    return Seen("parsed", doc)


# (row, result.json, failure.json) -> (collect, state, fault, reason or the `why` part)
ROWS = [
    ("valid result", parsed(OK), MISSING, (True, "succeeded", None, None)),
    ("valid result wins over a failure", parsed(OK),
     parsed({"reason": "x", "fault": "job"}), (True, "succeeded", None, None)),
    ("result over the inline limit: the job's fault", Seen("too_big", size=300 * 1024),
     MISSING, (True, "failed", "job", "307200 bytes, over")),
    ("result without envelope proves nothing", parsed({"payload": {}}), MISSING,
     (False, None, None, "no 'envelope'")),
    ("result payload not an object", parsed({"envelope": 1, "payload": [1]}), MISSING,
     (False, None, None, "'payload' must be an object")),
    ("result not an object", parsed([OK]), MISSING, (False, None, None, "holds")),
    ("torn result, no failure", TORN, MISSING, (False, None, None, "result.json is unreadable")),
    ("nothing written: mid-work", MISSING, MISSING,
     (False, None, None, "result.json is missing; failure.json is missing")),
    ("failure, job fault", MISSING,
     parsed({"reason": "bad_payload", "detail": "no prompts", "fault": "job"}),
     (True, "failed", "job", "bad_payload: no prompts")),
    ("failure, host fault, no detail", MISSING, parsed({"reason": "no_gpu", "fault": "host"}),
     (True, "failed", "host", "no_gpu")),
    ("failure, transient: a retry", MISSING,
     parsed({"reason": "connection_lost", "detail": "eof", "fault": "transient"}),
     (True, "retry", "transient", "connection_lost: eof")),
    ("failure without fault: only the unseen exit could say", MISSING,
     parsed({"reason": "told_to_exit_2", "detail": "d"}), (False, None, None, "no 'fault'")),
    ("failure with an unknown fault", MISSING, parsed({"reason": "r", "fault": "mine"}),
     (False, None, None, "no 'fault'")),
    ("failure without reason", MISSING, parsed({"detail": "d", "fault": "job"}),
     (False, None, None, "no 'reason'")),
    ("failure with a non-text detail", MISSING,
     parsed({"reason": "r", "detail": {"x": 1}, "fault": "job"}),
     (False, None, None, "'detail' is not text")),
    ("failure not an object", MISSING, parsed(["r"]), (False, None, None, "not an object")),
    ("torn failure", MISSING, TORN, (False, None, None, "failure.json is unreadable")),
    ("failure over its bound", MISSING, Seen("too_big", size=FAILURE_MAX_BYTES + 1),
     (False, None, None, "failure.json is too_big")),
    ("torn result, valid failure: the failure", TORN,
     parsed({"reason": "r", "fault": "transient"}), (True, "retry", "transient", "r")),
]


@pytest.mark.parametrize("row,result,failure,want", ROWS, ids=[r[0] for r in ROWS])
def test_row(row: str, result: Seen, failure: Seen, want: tuple) -> None:
    collect, state, fault, text = want
    v = decide(result, failure, max_inline_kb=256)
    assert v.collect is collect, v
    assert (v.state, v.fault) == (state, fault), v
    if collect:
        assert v.reason == text or (text is not None and text in (v.reason or "")), v
        if state == "succeeded":
            assert v.result == OK
    else:
        assert text in v.why, v


def test_seen_reads_files(tmp_path: Path) -> None:
    f = tmp_path / "result.json"
    assert seen(f, 1024).state == "missing"
    f.write_text('{"envelope": 1, "payload": {}}')
    assert seen(f, 1024) == Seen("parsed", {"envelope": 1, "payload": {}}, f.stat().st_size)
    f.write_text('{"envelope": 1, "payl')  # a torn write
    s = seen(f, 1024)
    assert s.state == "unreadable" and "unreadable" in (s.problem or "")
    f.write_bytes(b"\xff\xfe{}")
    assert seen(f, 1024).state == "unreadable"
    f.write_text("x" * 2000)
    assert seen(f, 1024) == Seen("too_big", size=2000)
