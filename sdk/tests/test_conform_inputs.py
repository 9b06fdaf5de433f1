"""`oarbank-sdk conform` on what upstream modules bring (contract section 8): upstream-format
goldens are a named skip, never a FAIL; `conformance.json` `settings` are the settings file of
the services the kit starts; the manifest step runs the same page checks as `check`.

Each test runs the real kit on a copy of the reference module, changed in one place.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

from oarbank_sdk import conform

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "modelserver"

UPSTREAM_GOLDEN = {
    "name": "digest_of_hello",
    "key_inputs": {"prompts": ["hello"]},
    "stages": [{"name": "generate"}],
    "expected": {"digest": "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e", "digest_version": 2},
}




def example(tmp_path: Path, conformance: dict | None = None) -> Path:
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    if conformance is not None:
        doc = json.loads((mod / "conformance.json").read_text())
        doc.update(conformance)
        (mod / "conformance.json").write_text(json.dumps(doc))
    return mod


def run_kit(mod: Path) -> tuple[int, dict[str, tuple[str, str]]]:
    """The kit in this process, unconfined (the sandbox is not what these tests are about);
    {check name: (status, detail)}."""
    out = io.StringIO()
    rc = conform.run(mod, json_output=True, sandbox=False, stream=out)
    report = json.loads(out.getvalue())
    return rc, {c["name"]: (c["status"], c["detail"]) for c in report["checks"]}


def test_an_upstream_format_golden_is_a_skip_naming_the_coordinator(tmp_path: Path) -> None:
    mod = example(tmp_path)
    (mod / "goldens" / "digest_of_hello.json").write_text(json.dumps(UPSTREAM_GOLDEN))
    rc, checks = run_kit(mod)
    assert rc == 0, {k: v for k, v in checks.items() if v[0] == "FAIL"}
    status, detail = checks["golden digest_of_hello"]
    assert status == "skip"
    assert "upstream-format golden" in detail and "coordinator" in detail
    assert "digest_version 2" in detail
    # This project's goldens next to it still run.
    assert checks["golden hello"][0] == "ok"


def test_a_golden_of_neither_form_still_fails_naming_the_key(tmp_path: Path) -> None:
    # The skip is for upstream's form only: a broken golden is not hidden behind it.
    mod = example(tmp_path)
    (mod / "goldens" / "broken.json").write_text(json.dumps({"name": "broken", "payload": {}}))
    rc, checks = run_kit(mod)
    assert rc == 1
    assert checks["golden broken"] == ("FAIL", "broken.json: 'stage' must be a string")


def test_conformance_settings_are_the_services_settings_file(tmp_path: Path) -> None:
    # The example's `start` refuses bad settings: a refused start proves the file was read.
    rc, checks = run_kit(example(tmp_path / "bad", {"settings": {"slots": 0}}))
    assert rc == 1
    status, detail = checks["service model: start"]
    assert status == "FAIL" and "setting 'slots' must be a positive integer, got 0" in detail

    rc, checks = run_kit(example(tmp_path / "good", {"settings": {"load_s": 0.2, "slots": 2}}))
    assert rc == 0, {k: v for k, v in checks.items() if v[0] == "FAIL"}
    assert checks["settings"][0] == "ok" and "2 key(s)" in checks["settings"][1]


def test_settings_that_are_not_an_object_fail_naming_them(tmp_path: Path) -> None:
    rc, checks = run_kit(example(tmp_path, {"settings": ["load_s", 0.2]}))
    assert rc == 1
    assert checks["settings"] == ("FAIL", "conformance.json: 'settings' must be an object, "
                                          "got a list")


def test_a_conformance_file_with_settings_only_is_not_a_failure(tmp_path: Path) -> None:
    mod = example(tmp_path)
    (mod / "conformance.json").write_text(json.dumps({"settings": {"load_s": 0.1}}))
    rc, checks = run_kit(mod)
    assert rc == 0, {k: v for k, v in checks.items() if v[0] == "FAIL"}
    assert checks["service_specs"] == ("skip", "conformance.json lists none")


def test_the_manifest_step_fails_what_check_rejects_with_the_same_words(tmp_path: Path) -> None:
    mod = example(tmp_path)
    panel = mod / "ui" / "panels" / "node.json"
    doc = json.loads(panel.read_text())
    at = next(i for i, c in enumerate(doc["body"]) if c.get("type") == "kv")
    doc["body"][at]["items"][0] = {"type": "status"}  # neither label nor key
    panel.write_text(json.dumps(doc))
    check = subprocess.run([sys.executable, "-m", "oarbank_sdk", "check", str(mod)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1
    check_lines = check.stdout.splitlines()[1:]
    assert check_lines, check.stdout
    rc, checks = run_kit(mod)
    assert rc == 1
    status, detail = checks["manifest"]
    assert status == "FAIL" and detail == "; ".join(check_lines)
    assert f"ui/panels/node.json: body[{at}].items[0]" in detail
