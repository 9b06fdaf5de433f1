"""The agent counts every network attempt the sandbox refuses its children, per service and per
attempt, though they swallow the refusal and log nothing: `status` (`sandbox_refusals`), the
status table, and a failed service's row `error`. Real agent, real kernel (seccomp user
notification), real processes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from agent_helpers import MODFILES, write_module

from oarbank_sdk import sandbox

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not sandbox.available(),
    reason="needs the Linux sandbox (seccomp + no_new_privs)")

MOD = "test.agent.quiet"


def quiet_module(root: Path) -> Path:
    mod = write_module(root, module_id=MOD,
                       service={"exec": ["python", "-I", "{bundle}/quiet_trier.py"],
                                "lifecycle": "always", "start_timeout_s": 10,
                                "restart": {"backoff_initial_s": 0.2, "backoff_max_s": 0.5,
                                            "max_failures": 2}},
                       runner={"exec": ["python", "-I", "{bundle}/quiet_trier.py"]})
    shutil.copy(MODFILES / "quiet_trier.py", mod / "quiet_trier.py")
    return mod


def test_attempts_of_a_quiet_service_and_runner_are_counted(start_agent, tmp_path: Path) -> None:
    agent = start_agent([quiet_module(tmp_path / "quiet")])
    agent.wait_for(lambda: agent.service_row()["ready"], 30, "the quiet service ready")
    job = agent.run_job("echo", {}, module=MOD)
    assert job["state"] == "succeeded", job  # the runner swallowed its refusals and succeeded
    st = agent.status()
    assert st["sandbox_refusals_counted"] is True
    refused = st["sandbox_refusals"]
    svc = refused[f"{MOD}/echo"]
    assert svc["count"] == 2, svc  # socket(AF_INET), then listen() on its socketpair end
    assert re.fullmatch(r"socket\(AF_INET\) by pid \d+ \(python[\d.]*: \S+ -I \S+/quiet_trier\.py "
                        r"serve\)", svc["first"]), svc
    assert svc["last"].startswith("listen() by pid ")
    att = refused[f"{job['job_id']}.1"]
    assert att["count"] == 2 and att["first"].startswith("socket(AF_INET6) by pid "), att
    assert att["last"].startswith("connect() by pid ") and "quiet_trier.py run" in att["last"]
    # the service serves on: no error on its row, ready
    row = agent.service_row()
    assert row["ready"] is True and row["error"] is None, row
    # the status table shows them too
    table = agent.cli("status", "--state-dir", str(agent.state_dir)).stdout
    assert re.search(rf"^{re.escape(MOD)}/echo\s+2\s+listen\(\) by pid", table, re.M), table
    assert f"{job['job_id']}.1" in table
    # and the agent logged each one (WARNING), naming its key
    assert f"{MOD}/echo: the sandbox refused socket(AF_INET) by pid" in agent.log()
    # a watch ends with the processes it watched: more attempts, no more descriptors
    fds = agent.fd_count()
    for _ in range(3):
        assert agent.run_job("echo", {}, module=MOD)["state"] == "succeeded"
    agent.wait_fds_back(fds, timeout=10)
    assert len(agent.status()["sandbox_refusals"]) == 1 + 4  # the service, four attempts


def test_a_service_that_fails_after_refused_attempts_says_so_in_its_error(
        start_agent, tmp_path: Path) -> None:
    agent = start_agent([quiet_module(tmp_path / "quiet")], settings={MOD: {"give_up": True}})
    agent.wait_for(lambda: agent.service_row()["withdrawn"], 60, "the service withdrawn")
    # One snapshot: a withdrawn service is probed and started again after its backoff, each
    # start refused twice more, while its error keeps the count at the failure it describes.
    status = agent.status()
    row = next(r for r in status["services"] if r["module"] == MOD)
    said = re.search(r"\(the sandbox refused (\d+) network attempt\(s\), the last: listen\(\) by "
                     r"pid \d+ \(python[\d.]*: \S+ -I \S+/quiet_trier\.py serve\)\)$", row["error"])
    assert said, row
    n = status["sandbox_refusals"][f"{MOD}/echo"]["count"]
    # each of its starts: socket + listen on its socketpair end
    assert 4 <= int(said.group(1)) <= n and int(said.group(1)) % 2 == 0, (said.group(1), n)
    # the heartbeat row is the same row (Agent.report)
    report = json.loads(subprocess.run(
        [sys.executable, "-m", "oarbank_agent", "status", "--state-dir", str(agent.state_dir),
         "--json"], capture_output=True, text=True, timeout=60).stdout)
    beat = report["services"][0]["error"]
    assert "(the sandbox refused " in beat, beat
    assert beat.split(" (the sandbox refused")[0] == row["error"].split(" (the sandbox refused")[0]
