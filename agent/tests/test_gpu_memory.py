"""GPU memory (host/gpumem.py): read through NVML's binding, unknown with its reason, never
zero. This machine has no NVIDIA GPU: the real binding (nvidia-ml-py) is read with the GPU
absent; what a GPU would answer is given by a stand-in binding (said where it is used)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from oarbank_agent.host.gpumem import Reader


def test_the_real_binding_without_a_gpu_says_unknown_and_why() -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py (pip install 'oarbank-agent[gpu]')")
    read = Reader().read()
    if read.error is None:  # pragma: no cover - a machine with a GPU
        pytest.skip("this machine has an NVIDIA GPU")
    assert read.error.startswith("GPU memory unknown: NVML: ")
    assert (read.used_bytes, read.total_bytes, read.gpus) == (None, None, [])
    assert read.held_by({1, 2}) is None  # unknown, not 0


def test_without_the_binding_it_says_how_to_install_it() -> None:
    class Missing:
        def nvmlInit(self) -> None:
            raise ImportError("No module named 'pynvml'")

    read = Reader(Missing()).read()
    assert read.error == ("GPU memory unknown: nvidia-ml-py is not installed "
                          "(pip install 'oarbank-agent[gpu]')")


class StandIn:
    """What NVML answers on a two-GPU machine (no GPU here to ask)."""

    def __init__(self) -> None:
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H100"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=(6 if h == 0 else 1) << 30, total=80 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=100 + h, usedGpuMemory=(5 << 30) if h == 0 else None)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[Any]:
        return []


def test_each_gpus_memory_and_what_each_process_holds() -> None:
    nv = StandIn()
    reader = Reader(nv)
    read = reader.read()
    assert read.error is None
    assert (read.used_bytes, read.total_bytes) == (7 << 30, 160 << 30)
    assert read.gpus[0] == {"index": 0, "name": "NVIDIA H100", "used_bytes": 6 << 30,
                            "total_bytes": 80 << 30}
    assert read.held_by({100, 7}) == 5 << 30
    assert read.held_by({101}) == 0  # the driver did not say (N/A): not counted
    reader.read()
    assert nv.inits == 1  # started once


def test_an_agent_reports_gpu_memory_unknown_with_the_reason(start_agent, echo_module: Path) -> None:
    agent = start_agent([echo_module], extra_args=["--gpu-apis", "none"])
    assert agent.run_job("echo", {})["state"] == "succeeded"
    st = agent.status()
    m = st["metrics"]
    assert m["gpu_mem_used_bytes"] is None and m["gpu_mem_total_bytes"] is None
    assert m["gpu_mem_error"].startswith("GPU memory unknown: ")
    assert all(r["gpu_mem_bytes"] is None for r in st["services"])


def test_a_reserve_that_turns_negative_is_named_and_nothing_is_offered(
        start_agent, tmp_path: Path) -> None:
    """At load a bad reserve refuses the module (test_reserve_refusal.py); one that a later
    fingerprint reports (here: after a settings change and `reload`) makes the service
    unhealthy with the key named, and its jobs wait saying so."""
    from agent_helpers import write_module

    mod = write_module(tmp_path / "m", service={"reserves_host_memory": True})
    agent = start_agent([mod], {"test.agent.echo": {"reserve_gb": 0.1}},
                        extra_args=["--gpu-apis", "none"])
    assert agent.service_row()["health"] == "healthy"
    (agent.root / "settings-test.agent.echo.json").write_text(json.dumps({"reserve_gb": -1}))
    r = agent.cli("reload", "--state-dir", str(agent.state_dir))
    assert r.returncode == 0, r.stderr
    agent.wait_for(lambda: agent.service_row()["health"] == "unhealthy", what="the refingerprint")
    row = agent.service_row()
    assert row["error"] == "fingerprint: reserve.mem_gb: must be a number >= 0 (GB), got -1"
    job = agent.submit("echo", {})
    agent.wait_for(lambda: "reserve.mem_gb" in (next(
        j for j in agent.status()["jobs"] if j["job_id"] == job)["reason"] or ""),
        what="the job's reason naming the key")
