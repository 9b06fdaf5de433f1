"""`oarbank-sdk conform` holds a runner's `doctor --json` to the contract's form (section 4):
one JSON object, exit 0 even when unhealthy, `runner_protocol`, `health`, `capabilities`,
`checks`. The pure verdict first, then real conform runs on copies of the reference module
whose doctor answers each way (unconfined, as the other catch tests)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from test_conform_catches import EXAMPLE, run

from oarbank_sdk.conform.doctor import judge_answer
from oarbank_sdk.conform.report import FAIL, OK, WARN

HEALTHY = {"runner_protocol": {"supported": [1]}, "health": "healthy", "capabilities": [],
           "checks": [{"name": "python", "ok": True}]}




def test_the_verdict_on_each_answer() -> None:
    assert judge_answer(0, json.dumps(HEALTHY), 60) == (OK, "healthy")
    unhealthy = dict(HEALTHY, health="unhealthy",
                     checks=[{"name": "weights", "ok": False, "detail": "/m gone"}])
    assert judge_answer(0, json.dumps(unhealthy), 60) == (OK, "unhealthy (weights: /m gone)")
    assert judge_answer(1, json.dumps(unhealthy), 60)[0] == FAIL  # exit 0 even when unhealthy
    assert judge_answer(None, "", 60) == (FAIL, "did not finish within 60 s")
    assert judge_answer(0, "hello\n", 60)[0] == FAIL
    status, detail = judge_answer(0, json.dumps({"ok": True}), 60)
    assert status == WARN and "older" in detail
    status, detail = judge_answer(0, json.dumps(dict(HEALTHY, health="fine",
                                                     checks=[{"name": 3}])), 60)
    assert status == FAIL
    assert "health: must be one of healthy, unhealthy, undetected, got 'fine'" in detail
    assert "checks[0]: must be" in detail


def _with_doctor(tmp_path, answer: str, exit_code: int = 0):
    bundle = tmp_path / "mod"
    shutil.copytree(EXAMPLE, bundle, ignore=shutil.ignore_patterns("__pycache__"))
    runner = bundle / "model_runner.py"
    text = runner.read_text()
    body = f"    print({answer!r})\n    return {exit_code}\n"
    text, n = re.subn(r"(def doctor\(as_json: bool\) -> int:\n)(?:    .*\n)+", r"\1" + body.replace(
        "\\", "\\\\"), text, count=1)
    assert n == 1, "the example's doctor() moved: update this test"
    runner.write_text(text)
    return bundle


def _doctor_check(report: dict) -> dict:
    return next(c for c in report["checks"] if c["name"] == "runner doctor")


@pytest.mark.parametrize(("answer", "exit_code", "status", "says"), [
    (json.dumps(HEALTHY), 0, "ok", "healthy"),
    (json.dumps(dict(HEALTHY, health="undetected",
                     checks=[{"name": "gpu", "ok": False, "detail": "no driver"}])), 0, "ok",
     "undetected (gpu: no driver)"),
    (json.dumps({"ok": True}), 0, "warn", "older"),
    (json.dumps(dict(HEALTHY, capabilities="events")), 0, "FAIL",
     "capabilities: must be a list of strings"),
    (json.dumps(HEALTHY), 3, "FAIL", "exit 3"),
    ("not json", 0, "FAIL", "printed no JSON object"),
])
def test_conform_runs_the_doctor_and_names_what_is_wrong(tmp_path, answer, exit_code, status,
                                                         says) -> None:
    rc, report = run(_with_doctor(tmp_path, answer, exit_code))
    check = _doctor_check(report)
    assert check["status"] == status and says in check["detail"], check
    assert rc == (1 if status == "FAIL" else 0), report  # the rest of the example passes
