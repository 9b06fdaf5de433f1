"""A failed op or runner says why: the last meaningful line of its stderr (its log) ends the
error the agent records, bounded, however much the child wrote."""

from __future__ import annotations

import json
from pathlib import Path

from agent_helpers import write_module

from oarbank_sdk import logtail

MODULE = "test.agent.echo"
WHY = "FileNotFoundError: model weights missing"


def _peak_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_a_failed_start_shows_its_last_stderr_line_bounded(start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", service={
        "restart": {"backoff_initial_s": 60, "backoff_max_s": 60, "max_failures": 1}})
    # 40 MiB of noise, then a traceback: the agent reads only the end of it.
    agent = start_agent([mod], {"echo": {"op_raise": {"start": "model weights missing"},
                                         "op_stderr_kb": 40 * 1024}})
    peak_before = _peak_rss_kb(agent.pid)
    agent.submit("echo", {})
    agent.wait_for(lambda: agent.service_row()["withdrawn"], 60, "the service withdrawn")
    row = agent.service_row()
    assert row["error"] == f"start exited with 1: {WHY}", row
    # The operator's view: status (table and --json) shows it.
    human = agent.cli("status", "--state-dir", str(agent.state_dir))
    assert human.returncode == 0 and f"start exited with 1: {WHY}" in human.stdout, human
    as_json = json.loads(agent.cli("status", "--state-dir", str(agent.state_dir),
                                   "--json").stdout)
    [srow] = as_json["services"]
    assert srow["error"] == f"start exited with 1: {WHY}"
    # 40 MiB went through the service log (rotated at --log-max-mb, 10 MiB by default, with
    # 5 older files kept: servicelog.py), not through the agent's memory.
    logs = list((agent.state_dir / "modules" / MODULE / "logs").glob("echo.log*"))
    assert sum(p.stat().st_size for p in logs) >= 40 * 2**20
    assert all(p.stat().st_size <= 10 * 2**20 for p in logs)
    grew_mb = (_peak_rss_kb(agent.pid) - peak_before) / 1024
    assert grew_mb < 16, f"the agent's peak memory grew by {grew_mb:.0f} MiB"


def test_a_failed_fingerprint_says_why_and_its_stderr_reaches_the_log_bounded(
        start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m")
    # Not `start`: this op's stderr goes to a file of its own, copied into the service log
    # (at most 1 MiB of it, the end kept) and removed.
    agent = start_agent([mod], {"echo": {"op_raise": {"fingerprint": "no GPU driver"},
                                         "op_stderr_kb": 3 * 1024}})
    row = agent.service_row()
    assert row["health"] == "unhealthy"
    assert row["error"] == ("fingerprint failed: fingerprint exited with 1: "
                            "FileNotFoundError: no GPU driver"), row
    log = (agent.state_dir / "modules" / MODULE / "logs" / "echo.log").read_bytes()
    assert b"FileNotFoundError: no GPU driver" in log
    assert b"bytes of this op's stderr were left out]" in log
    assert len(log) < 2 * 2**20, len(log)
    left = [p.name for p in (agent.state_dir / "run" / "ops").iterdir()]
    assert not left, f"op output files left behind: {left}"


CRASH_RUNNER = '''
import json, sys
spec = json.load(open(sys.argv[sys.argv.index("--spec") + 1]))
p = spec["payload"]
for _ in range(p.get("noise_kb", 0)):
    print("progress " * 113)          # stdout and stderr both go to runner.log
sys.stdout.flush()
if p.get("exit") is not None:
    print(p["last"], file=sys.stderr)
    sys.exit(p["exit"])
raise ValueError(p["last"])
'''


def test_a_runner_failing_without_failure_json_gives_its_log_tail(
        start_agent, tmp_path: Path) -> None:
    mod = write_module(tmp_path / "m", with_service=False,
                       runner={"exec": ["python", "-I", "{bundle}/crash_runner.py"]},
                       stages=[{"name": "plain", "timeout_s": 60,
                                "retry": {"max_attempts": 1}}])
    (mod / "crash_runner.py").write_text(CRASH_RUNNER)
    agent = start_agent([mod])
    job = agent.run_job("plain", {"noise_kb": 5 * 1024, "last": "bad prompt template"})
    assert job["state"] == "failed"
    assert job["reason"] == "runner exited with 1: ValueError: bad prompt template", job
    # Exit 75 needs failure.json to be retried; without it, the log says what happened.
    job = agent.run_job("plain", {"exit": 75, "last": "CUDA out of memory " + "x" * 900})
    assert job["state"] == "failed"
    prefix = "runner exited with 75 but failure.json is missing: CUDA out of memory xxx"
    assert job["reason"].startswith(prefix), job
    assert len(job["reason"]) <= len("runner exited with 75 but failure.json is missing: ") + 300


def test_summary_picks_the_exception_line_and_stays_bounded() -> None:
    tb = ("loading\nTraceback (most recent call last):\n  File \"s.py\", line 3, in <module>\n"
          "    main()\n    ^^^^^^\nFileNotFoundError: model weights missing\n\n")
    assert logtail.summary(tb) == WHY
    assert logtail.summary("a\n\x1b[31merror:\x1b[0m disk full\r\n\n") == "error: disk full"
    assert logtail.summary("\n \n") is None
    long = logtail.summary("y" * 5000)
    assert long is not None and len(long) == logtail.SUMMARY_CHARS and long.endswith("...")
    assert logtail.with_summary("start exited with 1", "") == "start exited with 1"
