"""`oarbank-sdk conform` catches what breaks every job on a node, at once, naming the fix.

Real conform runs on the broken modules of ``broken_modules/`` (real processes, channels and
ops; unconfined so that the checks do not depend on the machine's sandbox), and on copies of
the reference module edited the way an author's first change goes wrong.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from oarbank_sdk import conform

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "modelserver"
BROKEN = Path(__file__).resolve().parent / "broken_modules"




def broken(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(BROKEN / name, dst)
    for f in (BROKEN / "_shared").glob("*.py"):
        shutil.copy(f, dst / f.name)
    return dst


def run(bundle: Path, **kw) -> tuple[int, dict]:
    out = io.StringIO()
    rc = conform.run(bundle, json_output=True, sandbox=False, stream=out, **kw)
    return rc, json.loads(out.getvalue())


def failures(report: dict) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in report["checks"] if c["status"] == "FAIL"}


def test_fingerprint_pools_other_than_provides_fail(tmp_path):
    rc, report = run(broken(tmp_path, "fp_pools"))
    assert rc == 1
    detail = failures(report)["service echo: fingerprint"]
    assert "pools keys ['model'] differ from the manifest's provides.pools ['echo']" in detail
    assert "missing ['echo'] (jobs reserving them wait forever)" in detail


def test_fingerprint_without_service_protocol_1_fails(tmp_path):
    rc, report = run(broken(tmp_path, "fp_protocol"))
    assert rc == 1
    detail = failures(report)["service echo: fingerprint"]
    assert detail.startswith("fingerprint service_protocol.supported is [2]: it must list 1")


def test_ready_true_without_hello_fails_at_once_not_after_the_timeout(tmp_path):
    bundle = broken(tmp_path, "ready_no_hello")  # start_timeout_s = 60
    t0 = time.monotonic()
    rc, report = run(bundle)
    took = time.monotonic() - t0
    assert rc == 1
    assert failures(report) == {"service echo: hello": (
        "`ready` answered true but no hello came: the daemon must create "
        "`service_endpoint.Acceptor()` before loading; it says hello, and `ready` may say true "
        "only after it")}
    assert took < 40, f"{took:.1f} s: the kit waited for start_timeout_s"


def test_start_that_does_not_pass_the_channel_names_the_fix_and_the_daemons_last_line(tmp_path):
    bundle = broken(tmp_path, "no_inherit")
    t0 = time.monotonic()
    rc, report = run(bundle)
    assert rc == 1 and time.monotonic() - t0 < 40
    detail = failures(report)["service echo: hello"]
    fix, last_line = detail.split("; the service's last log line: ")
    assert fix == ("the service closed its channel (end of file) before its hello: no process "
                   "of the service is left: `start` must pass the channel on: "
                   "`subprocess.Popen(..., **service_endpoint.inherit_channel())`, and the daemon "
                   "must keep running (see why it exited)")
    # the daemon's own words, from its log: Acceptor() found the channel's variable naming a
    # descriptor it does not hold (the number is whichever one the agent passed; Windows'
    # handle error reads "The handle is invalid", Wine's "Invalid handle")
    not_held = (r"'handle:\d+' is not usable: \[WinError 6\] (The handle is invalid|Invalid handle)"
                if sys.platform == "win32" else r"'fd:\d+' is not usable: \[Errno 9\] Bad file descriptor")
    assert re.fullmatch(r"oarbank_sdk\.endpoint\.errors\.EndpointError: bad_endpoint: "
                        r"OARBANK_ENDPOINT_CHANNEL=" + not_held, last_line), last_line
    # and the tail of its logs under the failing check
    notes = report["notes"]
    assert notes[0] == "service echo: the end of its logs" and "== service.log ==" in notes
    assert any("acc = ep.Acceptor()" in line for line in notes), notes


def test_no_hello_names_the_acceptor(tmp_path):
    rc, report = run(broken(tmp_path, "no_hello"))
    assert rc == 1
    assert failures(report)["service echo: hello"] == (
        "no hello within start_timeout_s (2 s): the daemon must create "
        "`service_endpoint.Acceptor()` before loading; it says hello")


def test_a_result_without_envelope_says_what_was_found(tmp_path):
    rc, report = run(broken(tmp_path, "no_envelope"))
    assert rc == 1
    assert failures(report) == {"golden one": "result.json has no 'envelope' (its keys: "
                                              "['payload']): write {\"envelope\": 1, \"payload\": {...}}"}


def _conformance(bundle: Path, specs: list[dict]) -> None:
    (bundle / "conformance.json").write_text(json.dumps({"service_specs": specs}))


def test_expect_body_is_checked_as_a_subset(tmp_path):
    bundle = broken(tmp_path, "healthy")
    _conformance(bundle, [
        {"name": "subset", "service": "echo", "path": "/echo", "body": {"prompt": "hi"},
         "expect": {"body": {"text": "HI"}}},
        {"name": "differs", "service": "echo", "path": "/echo", "body": {"prompt": "hi"},
         "expect": {"status": 200, "body": {"text": "hi"}}},
        {"name": "missing key", "service": "echo", "path": "/echo", "body": {"prompt": "hi"},
         "expect": {"body": {"score": 1}}},
    ])
    rc, report = run(bundle)
    assert rc == 1
    assert failures(report) == {
        "spec differs": 'POST /echo -> 200, but body.text: expected "hi", got "HI"',
        "spec missing key": "POST /echo -> 200, but body.score: missing (expected 1)",
    }
    ok = {c["name"]: c["detail"] for c in report["checks"] if c["status"] == "ok"}
    assert ok["spec subset"] == "POST /echo -> 200 with the expected body"


def test_keep_keeps_the_data_folder_and_says_where(tmp_path):
    bundle = broken(tmp_path, "healthy")
    rc, report = run(bundle, keep=True)
    assert rc == 0, failures(report)
    kept = re.search(r"kept the node folder: (\S+) ", report["notes"][-1]).group(1)
    try:
        root = Path(kept)
        assert (root / "modules" / "dev.test.broken_healthy").is_dir()
        assert (root / "ops" / "echo" / "start.err").is_file()
    finally:
        shutil.rmtree(kept, ignore_errors=True)


def test_without_keep_nothing_is_left(tmp_path):
    bundle = broken(tmp_path, "healthy")
    rc, report = run(bundle)
    assert rc == 0 and report["notes"] == []


def _example_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "mod"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def test_a_page_naming_a_service_or_query_the_module_lacks_fails_check_and_conform(tmp_path):
    bundle = _example_copy(tmp_path)
    page = bundle / "ui" / "pages" / "overview.json"
    page.write_text(page.read_text().replace('"params": {"service": "model"}',
                                             '"params": {"service": "scorer"}'))
    panel = bundle / "ui" / "panels" / "node.json"
    panel.write_text(panel.read_text().replace('"query": "services"', '"query": "servces"', 1))
    done = subprocess.run([sys.executable, "-m", "oarbank_sdk", "check", str(bundle)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert ('ui/pages/overview.json: body[3].source.params.service: the module has no service '
            '"scorer" (its services: model): the page would show nothing') in done.stdout
    assert ('ui/panels/node.json: body[1].source.query: no query "servces": a portal answers '
            'services') in done.stdout
    out = io.StringIO()
    assert conform.run(bundle, json_output=True, sandbox=False, stream=out) == 1
    report = json.loads(out.getvalue())
    assert 'no service "scorer"' in failures(report)["manifest"]


def test_an_unknown_manifest_key_names_the_file_and_the_likely_key(tmp_path):
    bundle = _example_copy(tmp_path)
    toml = bundle / "oarbank-module.toml"
    toml.write_text(toml.read_text().replace("idle_timeout_s = 600", "idle_timout_s = 600"))
    out = io.StringIO()
    rc = conform.run(bundle, sandbox=False, stream=out)
    lines = out.getvalue().splitlines()
    assert rc == 1
    assert lines[0].startswith(f"FAIL manifest: {toml}: services[0].idle_timout_s: unknown key; "
                               "did you mean 'idle_timeout_s'? [[services]] takes: ")
    assert lines[-1] == f"{bundle}: 0 passed, 1 failed, 0 skipped"  # not "? ?"


def test_a_non_endpoint_service_has_its_fingerprint_checked_too(tmp_path):
    bundle = broken(tmp_path, "healthy")
    toml = bundle / "oarbank-module.toml"
    toml.write_text(toml.read_text() + '''
[[services]]
name = "side"
exec = ["python", "-I", "{bundle}/service.py", "fp_pools"]
endpoint = false
lifecycle = "manual"
provides = { pools = ["side"] }
''')
    rc, report = run(bundle)
    assert rc == 1
    assert failures(report) == {"service side: fingerprint": (
        "fingerprint pools keys ['model'] differ from the manifest's provides.pools ['side']: "
        "missing ['side'] (jobs reserving them wait forever); not in provides.pools: ['model']; "
        "the fingerprint must answer the pools the manifest provides")}
    skipped = {c["name"]: c["detail"] for c in report["checks"] if c["status"] == "skip"}
    assert skipped["service side"] == "not an endpoint service: not started"
