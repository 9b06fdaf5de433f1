"""The agent on Windows, whole: ``oarbank-agent run`` with the reference module, unchanged, 8
jobs through one warm service (one model load, one service pid), then the agent killed and
nothing of it left running.

Windows only: under Wine with Windows' own CPython (``nox -s windows -- -q
agent/tests/test_windows_agent.py``; harness/tests/test_wine.py runs it from the Linux suite),
and on real Windows in the ``windows-latest`` workflow job. A real agent process, its control
pipe, real job objects, the module's own ops, daemon and runners.

Wine does not show, so this cannot either: a console Ctrl-Break reaching the agent (the test
kills it: TerminateProcess, which is also what a crash is), job memory limits, the sandbox
(none on Windows yet: ``--sandbox auto`` runs unconfined and says so).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "win32", reason="the Windows agent: run under Wine by `nox -s windows`, "
    "or on Windows")

REPO = Path(__file__).resolve().parents[2]
MODULE = REPO / "examples" / "modelserver"
SYNCHRONIZE = 0x00100000
WAIT_TIMEOUT = 0x102


def _runs(pid: int) -> bool:
    import ctypes

    kernel32: Any = ctypes.WinDLL("kernel32")  # type: ignore[attr-defined]
    handle = kernel32.OpenProcess(SYNCHRONIZE, False, pid)
    if not handle:
        return False
    try:
        return bool(kernel32.WaitForSingleObject(handle, 0) == WAIT_TIMEOUT)
    finally:
        kernel32.CloseHandle(handle)


class Agent:
    """``python -m oarbank_agent run`` on a state dir, its output collected."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "oarbank_agent", "run", "--state-dir", str(state),
             "--module", str(MODULE)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.append(raw.decode("utf-8", "replace").rstrip())

    def log(self) -> str:
        return "\n".join(self.lines[-60:])

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any("ready node=" in line for line in self.lines):
            assert self.proc.poll() is None, f"the agent exited {self.proc.returncode}:\n{self.log()}"
            assert time.monotonic() < deadline, f"the agent was not ready:\n{self.log()}"
            time.sleep(0.2)

    def call(self, req: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        from oarbank_agent.operate import control

        return control.request(self.state, req, timeout=timeout)


def test_eight_jobs_share_one_warm_service_and_a_killed_agent_leaves_nothing(
        tmp_path: Path) -> None:
    agent = Agent(tmp_path / "state")
    try:
        agent.wait_ready()
        ids = []
        for i in range(8):
            reply = agent.call({"op": "submit", "module": "dev.example.modelserver",
                                "stage": "generate", "payload": {"prompts": [f"hello {i}"]}})
            assert reply["ok"], reply
            ids.append(reply["job_id"])
        jobs = [agent.call({"op": "wait", "job_id": j, "timeout": 180}, timeout=200)["job"]
                for j in ids]
        assert [j["state"] for j in jobs] == ["succeeded"] * 8, (jobs, agent.log())
        assert [j["result"]["payload"]["texts"][0].split(" [")[0] for j in jobs] == [
            f"{i} olleh" for i in range(8)]  # each prompt answered by the model
        pids = {pid for j in jobs for pid in j["result"]["provenance"]["service_pids"]}
        assert len(pids) == 1, pids  # one daemon served all eight
        assert {j["result"]["provenance"]["loads"] for j in jobs} == {1}  # loaded once
        loads = (tmp_path / "state" / "modules" / "dev.example.modelserver" / "data"
                 / "model.loads")
        assert loads.read_text().split() == [str(next(iter(pids)))]  # the daemon's one load
        (service_pid,) = pids
        assert _runs(service_pid)
        status = agent.call({"op": "status"})["status"]
        rows = [s for s in status["services"] if s["service"] == "model"]
        assert rows and rows[0]["pid"] == service_pid and rows[0]["ready"], rows
        # The sandbox, wall by wall as Windows has them: job objects' enforced, no network wall.
        sandbox = status["sandbox"]
        assert sandbox["job_ui_limits"] == sandbox["job_process_limit"] == "enforced", sandbox
        assert sandbox["windows_appcontainer"] == "unavailable", sandbox
        assert sandbox["endpoints"] == "unavailable" and "seccomp_socket" not in sandbox
    finally:
        agent.proc.kill()  # TerminateProcess: no cleanup of the agent's own runs
        agent.proc.wait(timeout=30)
        agent.reader.join(timeout=10)
        assert agent.proc.stdout is not None
        agent.proc.stdout.close()
    # The agent's kill-on-close job took its whole tree with it: the warm service too.
    deadline = time.monotonic() + 20
    while _runs(service_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _runs(service_pid), "the service outlived the killed agent"
