"""How a runner's exit maps to the attempt's outcome (contract section 4), on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oarbank_agent.jobs.runner import classify


def _write(workdir: Path, name: str, doc: object) -> None:
    (workdir / name).write_text(json.dumps(doc), encoding="utf-8")


def test_exit_0_with_an_enveloped_result_succeeds(tmp_path: Path) -> None:
    result = {"envelope": 1, "payload": {"texts": ["x"]}, "provenance": {"loads": 1}}
    _write(tmp_path, "result.json", result)
    out = classify(0, False, tmp_path, 60)
    assert (out.state, out.result) == ("succeeded", result)


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        (["not", "an", "object"], 'result.json holds a list ["not", "an", "object"], not '
                                   '{"envelope": 1, "payload": {...}}'),
        ({"payload": {}}, "result.json has no 'envelope' (its keys: ['payload']): write "
                          '{"envelope": 1, "payload": {...}}'),
        ({"envelope": 2, "payload": {}}, "result.json 'envelope' must be 1, got 2"),
        ({"envelope": 1, "payload": "text"}, "result.json 'payload' must be an object, got "
                                             '"text"'),
    ],
)
def test_exit_0_with_a_result_outside_the_contract_fails_naming_why(
    tmp_path: Path, doc: object, why: str
) -> None:
    _write(tmp_path, "result.json", doc)
    out = classify(0, False, tmp_path, 60)
    assert out.state == "failed"
    assert out.reason == f"exit 0 without a valid result.json: {why}"


def test_exit_0_without_result_fails(tmp_path: Path) -> None:
    out = classify(0, False, tmp_path, 60)
    assert out.reason == "exit 0 without a valid result.json: result.json is missing"


def test_transient_with_failure_json_is_retried(tmp_path: Path) -> None:
    _write(tmp_path, "failure.json", {"reason": "busy", "detail": "try later", "fault": "transient"})
    out = classify(75, False, tmp_path, 60)
    assert (out.state, out.reason, out.fault) == ("retry", "busy: try later", "transient")
