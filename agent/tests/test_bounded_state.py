"""Bounded state (issue 15, part 7): an op's stdout is read up to 1 MiB, result.json up to
[results].max_inline_kb, final job records are removed after --keep-jobs-s, and status shows
the last --jobs N. Real agents, real modules."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

from agent_helpers import write_module

from oarbank_agent.modules import compat
from oarbank_sdk import advice
from oarbank_sdk import manifest as mf


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", *args], capture_output=True,
                          text=True, timeout=120)


def test_an_op_printing_more_than_1_mib_fails_naming_the_size(start_agent, tmp_path):
    big = write_module(tmp_path / "big", module_id="test.agent.big")
    small = write_module(tmp_path / "small", module_id="test.agent.small")
    # 1025 KiB: over; 1000 KiB of noise and the document: under (read, and it counts)
    agent = start_agent([big, small], {"big": {"op_stdout_kb": {"fingerprint": 1025}},
                                       "small": {"op_stdout_kb": {"fingerprint": 1000}}})
    rows = {r["module"]: r for r in agent.status()["services"]}
    assert rows["test.agent.big"]["health"] == "unhealthy"
    error = rows["test.agent.big"]["error"]
    m = re.search(r"fingerprint printed (\d+) bytes", error)
    assert m and 1025 * 1024 < int(m.group(1)) < 1026 * 1024, error  # the noise + its document
    assert error == "fingerprint failed: " + advice.op_stdout_too_big("fingerprint",
                                                                       int(m.group(1)))
    assert "bytes on stdout, over the limit of 1048576 bytes (1 MiB)" in error
    assert rows["test.agent.small"]["health"] == "healthy"
    assert rows["test.agent.small"]["error"] is None
    assert agent.run_job("echo", {}, module="small")["state"] == "succeeded"


def test_a_result_over_max_inline_kb_fails_naming_its_size(start_agent, tmp_path):
    four = write_module(tmp_path / "four", module_id="test.agent.four",
                        extra="\n[results]\nmax_inline_kb = 4\n")
    default = write_module(tmp_path / "default", module_id="test.agent.default")
    agent = start_agent([four, default])
    assert agent.run_job("plain", {"pad_kb": 2}, module="four")["state"] == "succeeded"
    rec = agent.run_job("plain", {"pad_kb": 8}, module="four")
    size = (agent.state_dir / "jobs" / rec["job_id"] / "a1" / "result.json").stat().st_size
    assert size > 8 * 1024
    assert (rec["state"], rec["result"], rec["attempts"]) == ("failed", None, 1), rec
    assert rec["reason"] == advice.result_too_big(size, 4)
    assert rec["reason"].startswith(f"result.json is {size} bytes, over [results]"
                                    ".max_inline_kb = 4 (4096 bytes)")
    # the default: 256 KiB
    assert agent.run_job("plain", {"pad_kb": 200}, module="default")["state"] == "succeeded"
    rec = agent.run_job("plain", {"pad_kb": 300}, module="default")
    assert rec["state"] == "failed" and "max_inline_kb = 256 (262144 bytes)" in rec["reason"]


def test_a_bad_max_inline_kb_refuses_the_module(tmp_path):
    for value, shown in (('"big"', '"big"'), ("0", "0"), ("-1", "-1")):
        m = mf.load(write_module(tmp_path / f"m{shown}", extra=f"\n[results]\n"
                                 f"max_inline_kb = {value}\n"))
        assert compat.module_refusals(m, compat.this_node()) == [
            f"[results].max_inline_kb must be a positive number of KiB, got {shown} "
            "(default 256)"]


def test_final_jobs_are_removed_after_keep_jobs_s_and_wire_numbers_stay_used(
        start_agent, tmp_path):
    mod = write_module(tmp_path / "m")
    args = ["--keep-jobs-s", "3", "--drain-s", "0"]
    agent = start_agent([mod], extra_args=args)
    done = agent.run_job("echo", {})
    wire = agent.wire_attempt(done["job_id"])
    job_dir = agent.state_dir / "jobs" / done["job_id"]
    finished_at = json.loads((job_dir / "job.json").read_text())["finished_at"]
    # an unfinished job is never removed, however old
    sleeper = agent.submit("plain", {"sleep_s": 60})
    agent.wait_for(lambda: not job_dir.exists(), timeout=60, what="the record removed")
    assert time.time() - finished_at >= 3  # not before its time
    st = agent.status()
    assert [j["job_id"] for j in st["jobs"]] == [sleeper]
    assert "removed 1 final job record(s) older than 3s (--keep-jobs-s)" in agent.log()
    r = cli("status", "--state-dir", str(agent.state_dir), "--json")
    assert json.loads(r.stdout)["jobs_total"] == 1
    agent.stop()
    # a restarted agent continues the wire numbers after the removed job's
    again = start_agent([mod], state_dir=agent.state_dir, extra_args=args)
    job = again.run_job("echo", {})
    assert again.wire_attempt(job["job_id"]) > wire


def test_keep_jobs_s_must_be_positive(tmp_path):
    r = cli("run", "--state-dir", str(tmp_path / "s"), "--module", str(tmp_path),
            "--keep-jobs-s", "0")
    assert r.returncode == 2
    assert "--keep-jobs-s 0: must be > 0" in r.stderr


def test_status_jobs_n_shows_the_last_n_and_counts_the_rest(start_agent, tmp_path):
    agent = start_agent([write_module(tmp_path / "m")])
    ids = [agent.run_job("plain", {"i": i})["job_id"] for i in range(3)]
    r = cli("status", "--state-dir", str(agent.state_dir), "--jobs", "2")
    assert r.returncode == 0, r
    assert "jobs: 2 of 3 (page 1 of 2" in r.stdout
    assert ids[0] not in r.stdout and ids[1] in r.stdout and ids[2] in r.stdout
