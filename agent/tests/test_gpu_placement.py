"""GPU placement through a real agent: a GPU service exists only where its API does, a job
that needs it elsewhere is refused at once, a shared GPU service is one process for many jobs,
and detection on this machine (no GPU) reports none without hanging.

No GPU exists here, so the host's APIs come from ``--gpu-apis`` (the operator override the
contract provides); the service itself is the echo test service declared as a GPU service.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from agent_helpers import read_jsonl, write_module
from test_services import max_overlap

from oarbank_agent import platform as backends

SANDBOX_GPU = '\n[sandbox]\ndevices = { gpu = "compute" }\n'


def gpu_module(root: Path, use: str = "shared", apis: tuple[str, ...] = ("cuda",)) -> Path:
    return write_module(root, service={"gpu": {"use": use, "apis_any": list(apis)}},
                        extra=SANDBOX_GPU)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_agent", *args], capture_output=True,
                          text=True, timeout=60)


def test_missing_gpu_api_refuses_the_job_at_submit(start_agent, tmp_path: Path) -> None:
    agent = start_agent([gpu_module(tmp_path / "m", apis=("cuda", "rocm"))],
                        extra_args=["--gpu-apis", "vulkan,opencl"])
    r = cli("submit", "--state-dir", str(agent.state_dir), "--module", "echo", "--stage",
            "echo", "--payload", "{}")
    assert r.returncode == 2, r
    assert r.stderr.strip() == ("oarbank-agent: GPU_API_MISSING: needs cuda, rocm; "
                                "this node provides opencl, vulkan")
    st = agent.status()
    assert st["jobs"] == []  # nothing queued
    row = agent.service_row()
    assert row["gpu_api_missing"] is True and row["running"] is False and row["held"] is None
    assert st["gpu"] == {"apis": ["vulkan", "opencl"], "source": "override",
                         "probes": {"vulkan": "override", "opencl": "override"}}
    # The service is not offered here: not even its fingerprint op ran.
    assert not [e for e in read_jsonl(agent.module_data() / "events.jsonl")
                if e["event"] == "op"]
    # A stage that does not touch the GPU service still runs.
    assert agent.run_job("plain", {})["state"] == "succeeded"


def test_with_the_api_two_jobs_share_one_gpu_service_process(start_agent,
                                                             tmp_path: Path) -> None:
    agent = start_agent([gpu_module(tmp_path / "m")], {"echo": {"load_s": 0.3}},
                        extra_args=["--gpu-apis", "cuda"])
    assert agent.service_row()["gpu_api_missing"] is False
    ids = [agent.submit("echo", {"requests": 2, "sleep_s": 1.0}) for _ in range(2)]
    jobs = [agent.wait(j) for j in ids]
    assert [j["state"] for j in jobs] == ["succeeded"] * 2, jobs
    loads = (agent.module_data() / "loads").read_text().split()
    assert len(loads) == 1  # one load
    assert {p for j in jobs for p in j["result"]["payload"]["pids"]} == {int(loads[0])}
    runs = read_jsonl(agent.module_data() / "runs.jsonl")
    start = {r["attempt"]: r["t"] for r in runs if r["event"] == "start"}
    end = {r["attempt"]: r["t"] for r in runs if r["event"] == "end"}
    assert max_overlap([(start[a], end[a]) for a in start]) == 2  # both at once


def test_exclusive_gpu_service_admits_one_gpu_job_at_a_time(start_agent,
                                                            tmp_path: Path) -> None:
    agent = start_agent([gpu_module(tmp_path / "m", use="exclusive")],
                        extra_args=["--gpu-apis", "cuda"])
    ids = [agent.submit("echo", {"requests": 1, "sleep_s": 0.5}) for _ in range(2)]
    assert all(agent.wait(j)["state"] == "succeeded" for j in ids)
    runs = read_jsonl(agent.module_data() / "runs.jsonl")
    start = {r["attempt"]: r["t"] for r in runs if r["event"] == "start"}
    end = {r["attempt"]: r["t"] for r in runs if r["event"] == "end"}
    assert max_overlap([(start[a], end[a]) for a in start]) == 1


def test_detection_on_this_machine_reports_none_and_does_not_hang(start_agent,
                                                                  tmp_path: Path) -> None:
    t0 = time.monotonic()
    agent = start_agent([gpu_module(tmp_path / "m")])  # no override: detected at start
    started = time.monotonic() - t0
    gpu = agent.status()["gpu"]
    assert gpu["source"] == "detected" and gpu["apis"] == [], gpu
    # What a Mac can have under the darwin profile (contract section 5's table by backend)
    assert set(gpu["probes"]) == ({"metal", "vulkan", "opencl"} if backends.name() == "darwin"
                                  else {"cuda", "rocm", "vulkan", "opencl"})
    assert all(v.startswith("absent: ") for v in gpu["probes"].values()), gpu
    assert agent.service_row()["gpu_api_missing"] is True
    assert started < 60  # each probe has a 10 s watchdog; the agent came up regardless
    r = cli("submit", "--state-dir", str(agent.state_dir), "--module", "echo", "--stage",
            "echo", "--payload", "{}")
    assert r.returncode == 2
    assert "GPU_API_MISSING: needs cuda; this node provides none" in r.stderr
