"""A module whose service reads the channel the way upstream's SDK does (``int(msg["attempt"])``,
harness/e2e/modules/upstreamish) runs on this project's kit and agent: contract section 3 says
attempt ids are integers on the channel. If the kit or the agent sent a string id again, the
service's daemon would die on its first connection and both checks here would fail."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from harness_test_helpers import REPO

from harness.nodes.backends.base import copy_modules

UPSTREAMISH = REPO / "harness" / "e2e" / "modules" / "upstreamish"


def _module(tmp_path: Path) -> Path:
    """The module as a node gets it (the example's files completed by harness-base.txt)."""
    [mod] = copy_modules(tmp_path, [UPSTREAMISH])
    return mod


def test_its_daemon_dies_on_a_string_attempt_id_as_upstreams_does(tmp_path: Path) -> None:
    # The premise of the other tests: this service really does int() the id.
    mod = _module(tmp_path)
    data = tmp_path / "data"
    agent, child = socket.socketpair()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OARBANK_MODULE_DATA": str(data),
           "OARBANK_ENDPOINT_CHANNEL": f"fd:{child.fileno()}"}
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"load_s": 0}))
    env["OARBANK_SETTINGS_FILE"] = str(settings)
    proc = subprocess.Popen([sys.executable, "-I", str(mod / "upstream_model_service.py"),
                             "serve"], env=env, pass_fds=(child.fileno(),),
                            stderr=subprocess.PIPE, text=True)
    child.close()
    try:
        agent.settimeout(30)
        hello = json.loads(agent.makefile("rb").readline())
        assert hello == {"op": "hello", "pid": proc.pid}
        job_end, service_end = socket.socketpair()
        line = json.dumps({"op": "connection", "conn": 1, "attempt": "j1.1"}).encode() + b"\n"
        socket.send_fds(agent, [line], [service_end.fileno()])
        service_end.close()
        _out, err = proc.communicate(timeout=30)
        job_end.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        agent.close()
    assert proc.returncode != 0
    assert "ValueError: invalid literal for int() with base 10: 'j1.1'" in err


def test_it_passes_conform(tmp_path: Path) -> None:
    mod = _module(tmp_path)
    r = subprocess.run([sys.executable, "-m", "oarbank_sdk", "conform", "--json", str(mod)],
                       capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    report = json.loads(r.stdout)
    failed = [c for c in report["checks"] if c["status"] == "FAIL"]
    assert r.returncode == 0 and not failed, failed
    passed = {c["name"] for c in report["checks"] if c["status"] == "ok"}
    # The checks that need the daemon to take connections, not only to start.
    assert {"golden hello", "golden several_prompts", "spec generate",
            "service model: ended"} <= passed, sorted(passed)


@pytest.mark.slow
def test_it_passes_the_idle_stop_scenario(tmp_path: Path) -> None:
    # In fastmodel's place and with its id, so the scenario runs unchanged.
    mods = tmp_path / "modules"
    shutil.copytree(REPO / "harness" / "e2e" / "modules", mods, ignore=shutil.ignore_patterns("upstreamish"))
    shutil.rmtree(mods / "fastmodel")
    shutil.copytree(UPSTREAMISH, mods / "fastmodel")
    toml = mods / "fastmodel" / "oarbank-module.toml"
    toml.write_text(toml.read_text().replace('id = "dev.oarbank.e2e.upstreamish"',
                                             'id = "dev.oarbank.e2e.fastmodel"'))
    assert 'id = "dev.oarbank.e2e.fastmodel"' in toml.read_text()
    # The service the scenario drives is the upstream-style one, not the example's daemon.
    assert 'exec = ["python", "-I", "{bundle}/ops.py"]' in toml.read_text()
    out = tmp_path / "e2e"
    r = subprocess.run([sys.executable, "-m", "harness", "--backend", "local", "--scenario",
                        "idle-stop", "--out", str(out), "--modules-dir", str(mods)],
                       cwd=REPO, capture_output=True, text=True, timeout=280,
                       stdin=subprocess.DEVNULL)
    [cell] = json.loads((out / "report.json").read_text())["results"]
    assert r.returncode == 0 and cell["outcome"] == "passed", (cell, r.stdout[-2000:])
