"""GPU API detection: real probes in child processes on this machine, and the watchdog."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from oarbank_agent import platform as backends
from oarbank_agent.host import gpuapis


def test_detection_on_this_machine_reports_no_gpu_and_does_not_hang() -> None:
    # This machine has no GPU driver: every probe must come back "absent" with a reason,
    # quickly, and the result must list no API.
    start = time.monotonic()
    found = gpuapis.detect(timeout_s=20)
    assert time.monotonic() - start < 20
    assert found.apis == ()
    assert found.source == "detected"
    # What is probed follows the backend (contract section 5's table), so the darwin profile
    # asks what a Mac has, and its Metal probe says why it is absent here.
    expected = {"linux": {"cuda", "rocm", "vulkan", "opencl"},
                "darwin": {"metal", "vulkan", "opencl"}}[backends.name()]
    assert set(found.probes) == expected
    assert all(v.startswith("absent: ") for v in found.probes.values()), found.probes
    if backends.name() == "darwin":
        assert found.probes["metal"] == "absent: not macOS"


def test_a_hanging_probe_is_cut_by_the_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stand-in for a driver whose init never returns: the probe child sleeps forever.
    real_popen = subprocess.Popen

    def hanging(argv, **kw):
        if argv[-2:] == ["--probe", "vulkan"]:
            argv = [sys.executable, "-c", "import time; time.sleep(3600)"]
        return real_popen(argv, **kw)

    monkeypatch.setattr(gpuapis.subprocess, "Popen", hanging)
    start = time.monotonic()
    found = gpuapis.detect(timeout_s=1.0)
    assert time.monotonic() - start < 5
    assert "did not answer within 1 s" in found.probes["vulkan"]  # probed on every system
    assert "vulkan" not in found.apis


def test_override_is_validated() -> None:
    assert gpuapis.from_override("cuda,vulkan").apis == ("cuda", "vulkan")
    assert gpuapis.from_override("none").apis == ()
    with pytest.raises(ValueError, match="unknown GPU API quantum"):
        gpuapis.from_override("cuda,quantum")


def test_a_runners_gpu_detect_agrees_with_the_agent() -> None:
    # Upstream's runners call oarbank_sdk.gpu.detect() (in their own process) to learn which
    # APIs they reach; on a node it must name what the agent's report names, probe by probe.
    from oarbank_sdk import gpu

    if backends.name() == "darwin":
        pytest.skip("the darwin profile probes what a Mac has; a runner here probes Linux's")
    agent = gpuapis.detect(timeout_s=20)
    runner = gpu.detect()
    assert runner["host"] == sorted(agent.apis)
    for api, said in agent.probes.items():
        assert said == ("present" if api in runner["host"] else f"absent: {runner['evidence'][api]}")
