"""`oarbank-sdk conform` on runners written for upstream's SDK: the gpuinfo and reel stand-ins
(``manifests/upstream/{gpuinfo,reel}``, written here with upstream's imports and manifests)
fail nothing on an import, their ``runner_specs`` run, and every other kind of
``conformance.json`` entry is named, run or not, with why.

The kit runs in this process, unconfined (the sandbox is not what these tests are about; the
README's "Upstream's runner-side modules" runs them sandboxed by hand the same).
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from platform_marks import conform_kit

from oarbank_sdk import conform
from oarbank_sdk.conform import runnerspecs

HERE = Path(__file__).resolve().parent
UPSTREAM = HERE / "manifests" / "upstream"

pytestmark = conform_kit


def run_kit(mod: Path) -> tuple[int, dict[str, tuple[str, str]]]:
    out = io.StringIO()
    rc = conform.run(mod, json_output=True, sandbox=False, stream=out)
    report = json.loads(out.getvalue())
    return rc, {c["name"]: (c["status"], c["detail"]) for c in report["checks"]}


def copy(tmp_path: Path, name: str) -> Path:
    mod = tmp_path / name
    shutil.copytree(UPSTREAM / name, mod, ignore=shutil.ignore_patterns("__pycache__"))
    return mod


def test_gpuinfo_imports_gpu_and_platform_and_its_specs_run(tmp_path: Path) -> None:
    rc, checks = run_kit(copy(tmp_path, "gpuinfo"))
    assert rc == 0, {k: v for k, v in checks.items() if v[0] == "FAIL"}
    status, detail = checks["runner doctor"]
    assert status == "ok" and ("healthy" in detail or "undetected" in detail), detail
    assert checks["runner spec squares"] == ("ok", "exit 0, result written")
    assert checks["runner spec not numbers"] == (
        "ok", "exit 2, reason 'gpuinfo/bad_spec' as expected")


def test_reel_imports_control_and_its_specs_run_or_say_why_not(tmp_path: Path) -> None:
    rc, checks = run_kit(copy(tmp_path, "reel"))
    assert rc == 0, {k: v for k, v in checks.items() if v[0] == "FAIL"}
    assert checks["runner doctor"][0] == "ok"
    assert checks["runner spec with an asset"] == (
        "ok", "exit 0, result written, artifacts ['asset', 'frames', 'clip', 'log']")
    # Nine frames, a checkpoint every four: Checkpoints.write needs the --events file.
    assert checks["runner spec checkpoints on the way"][0] == "ok"
    assert checks["runner spec too many frames"] == (
        "ok", "exit 2, reason 'reel/bad_spec' as expected")
    status, detail = checks["runner spec from the shots"]
    assert status == "skip" and "'inputs:shots-1' has no 'dir'" in detail
    status, detail = checks["conformance.json ops"]
    assert status == "skip" and "no module coordinator" in detail


def test_every_kind_upstreams_kit_reads_is_named(tmp_path: Path) -> None:
    mod = copy(tmp_path, "gpuinfo")
    doc = json.loads((mod / "conformance.json").read_text())
    doc.update({"ops": [], "params": [{"n": 1}], "store": {}, "node_classes": [{}],
                "secrets": {"k": "v"}, "images": {}, "tools": {}, "net": {}, "frobs": 1})
    (mod / "conformance.json").write_text(json.dumps(doc))
    rc, checks = run_kit(mod)
    assert rc == 0, {k: v for k, v in checks.items() if v[0] == "FAIL"}
    for key, why in runnerspecs.NOT_RUN.items():
        assert checks[f"conformance.json {key}"] == ("skip", f"not run here: {why}")
    assert checks["conformance.json frobs"][0] == "warn"


@pytest.mark.parametrize(("entry", "problem"), [
    ({"name": "x", "payload": {}}, None),
    ("x", "must be a JSON object"),
    ({"payload": {}}, "'name' must be"),
    ({"name": "x", "payload": 3}, "'payload' must be an object"),
    ({"name": "x", "payload": {}, "bogus": 1}, "unknown key(s) ['bogus']"),
    ({"name": "x", "payload": {}, "expect": {"exit": "0"}}, "'expect.exit' must be"),
    ({"name": "x", "payload": {}, "expect": {"status": 200}}, "'expect' must be an object"),
    ({"name": "x", "payload": {}, "mounts": {"a": "b"}}, "which 'datasets' does not list"),
    ({"name": "x", "payload": {}, "datasets": ["a"], "mounts": {"a": "../up"}}, "inside the workdir"),
    ({"name": "x", "payload": {}, "expect": {"artifacts": "frames"}}, "list of names"),
])
def test_a_runner_spec_entry_is_checked_key_by_key(entry, problem) -> None:
    found = runnerspecs.spec_problem(entry)
    assert (found is None) if problem is None else (problem in (found or "")), found


def test_a_wrong_outcome_fails_naming_what_came(tmp_path: Path) -> None:
    mod = copy(tmp_path, "reel")
    doc = json.loads((mod / "conformance.json").read_text())
    doc["runner_specs"] = [
        {"name": "wrong exit", "payload": {"frames": 999}, "expect": {"exit": 0}},
        {"name": "wrong reason", "payload": {"frames": 0}, "expect": {"exit": 2, "reason": "reel/x"}},
        {"name": "wrong artifacts", "payload": {"frames": 1}, "expect": {"artifacts": ["frames"]}},
        {"name": "no such stage", "stage": "paint", "payload": {}},
        {"name": 7, "payload": {}},
    ]
    (mod / "conformance.json").write_text(json.dumps(doc))
    rc, checks = run_kit(mod)
    assert rc == 1
    assert checks["runner spec wrong exit"][0] == "FAIL"
    assert "exit 2 (reel/bad_spec" in checks["runner spec wrong exit"][1]
    assert "reason 'reel/bad_spec', expected 'reel/x'" in checks["runner spec wrong reason"][1]
    assert "artifacts ['frames', 'clip', 'log'], expected ['frames']" in \
        checks["runner spec wrong artifacts"][1]
    assert checks["runner spec no such stage"] == ("FAIL", "stage 'paint' is not in the manifest")
    assert "'name' must be" in checks["runner spec #4"][1]
