"""Runner control on Windows: the agent's ``AttemptControl`` with the Windows backend's nudge
(an auto-reset event the runner inherits, ``platform/windows/nudges.py``) and a real runner
process using the SDK's ``Control``: held at a safe point while paused, going on once resumed,
stopped at a safe point (exit 75, a transient failure.json) when asked.

Windows only: under Wine with Windows' own CPython (harness/tests/test_wine.py runs it from
the Linux suite), and on the ``windows-latest`` runner. The same document and the POSIX nudge
(SIGUSR1) run under real agents in test_job_control.py. The runner is started here as the
agent's spawn starts it (only the handles named inherited), not by a whole agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="Windows' inherited control event: run under Wine by "
    "`nox -s windows`, or on Windows")

RUNNER = r"""
import json, sys, time
from pathlib import Path
from oarbank_sdk.control import Control, Stopped
w = Path(sys.argv[1])
c = Control(w)
with open(w / "work.jsonl", "a", buffering=1) as log:
    n = 0
    try:
        while True:
            c.safe_point()
            log.write(json.dumps({"n": n, "t": time.time()}) + "\n")
            n += 1
            time.sleep(0.05)
    except Stopped:
        log.write(json.dumps({"stopped_after": n, "paused_s": c.paused_s}) + "\n")
sys.exit(c.acknowledge_stop())
"""


def _rows(workdir: Path) -> list[dict[str, float]]:
    try:
        text = (workdir / "work.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_runner_is_held_resumed_and_stopped_through_its_event(tmp_path: Path) -> None:
    from oarbank_agent.jobs import control
    from oarbank_agent.jobs.controlio import AttemptControl
    from oarbank_agent.platform.windows.nudges import EventNudges
    from oarbank_sdk.control import ENV_CONTROL_EVENT, EXIT_STOPPED
    from oarbank_sdk.protocol import current_transport

    ctl = AttemptControl(tmp_path, control.Accepts(stop=True, pause=True), EventNudges())
    nudge = ctl.open()
    assert set(nudge.env) == {ENV_CONTROL_EVENT} and len(nudge.inherit) == 1
    env = {**os.environ, **nudge.env}
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path)], env=env,
                            stdin=subprocess.DEVNULL,
                            **current_transport().inheritable_kwargs(*nudge.inherit))
    nudge.spawned()  # the runner holds its own copy now
    try:
        ctl.started(proc.pid, lambda: proc.poll() is None)
        _until(lambda: len(_rows(tmp_path)) >= 3, "the runner working")
        assert ctl.pause("memory pressure (test)")
        time.sleep(0.5)  # its next safe point (a unit is 0.05 s)
        held = len(_rows(tmp_path))
        time.sleep(1.5)
        assert len(_rows(tmp_path)) == held, "the runner went on working while paused"
        assert proc.poll() is None
        assert ctl.resume()
        _until(lambda: len(_rows(tmp_path)) >= held + 3, "the runner working again")
        assert ctl.ask_stop("drain (test)")
        assert proc.wait(timeout=30) == EXIT_STOPPED
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ctl.ended()
    last = _rows(tmp_path)[-1]
    assert last["stopped_after"] >= held + 3 and last["paused_s"] >= 1.5, last
    failure = json.loads((tmp_path / "failure.json").read_text())
    assert failure["fault"] == "transient", failure
    assert ctl.nudge is None  # the event's handles are closed with the attempt
