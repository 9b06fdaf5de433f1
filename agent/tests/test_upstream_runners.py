"""Runners written for upstream's SDK run on this agent unchanged: the gpuinfo and reel stand-ins
(``sdk/tests/manifests/upstream/{gpuinfo,reel}``: upstream's manifests, runners written here
with upstream's imports) as real jobs on a real agent.

- gpuinfo's doctor and result name the platform and the GPU APIs its runner reached
  (``oarbank_sdk.gpu.detect``, ``platform.current``); they are the agent's own. On a machine
  without a GPU the agent refuses its job quoting the runner's evidence, as upstream's
  ``undetected`` asks; the job then runs with the stand-in's ``GPUINFO_RUN_WITHOUT_GPU``.
- reel writes checkpoints on the ``--events`` file the agent passes a runner that declares
  upstream's ``checkpoint`` capability.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from agent_helpers import RunningAgent

from oarbank_agent import platform as backends
from oarbank_agent.operate import control

REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO / "sdk" / "tests" / "manifests" / "upstream"


def _copy(tmp_path: Path, name: str, runner_env: dict[str, str] | None = None) -> Path:
    mod = tmp_path / f"mod-{name}"
    shutil.copytree(UPSTREAM / name, mod, ignore=shutil.ignore_patterns("__pycache__"))
    if runner_env:
        toml = mod / "oarbank-module.toml"
        table = ", ".join(f'{k} = "{v}"' for k, v in runner_env.items())
        text = toml.read_text().replace("[runner]\n", f"[runner]\nenv = {{ {table} }}\n", 1)
        toml.write_text(text)
    return mod


def test_gpuinfo_names_this_nodes_platform_and_gpu_apis(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    if backends.name() == "darwin":
        pytest.skip("the darwin profile probes what a Mac has; the runner here probes Linux's")
    agent = start_agent([_copy(tmp_path, "gpuinfo")])
    status = agent.status()
    platform, gpu = status["platform"], status["gpu"]
    payload = {"numbers": [1, 2, 3]}
    if not gpu["apis"]:
        reply = control.request(agent.state_dir, {"op": "submit", "module": "gpuinfo",
                                                  "stage": "squares", "payload": payload})
        assert reply["code"] == "runner_undetected", reply
        for api, said in gpu["probes"].items():
            assert f"gpu api {api}: {said.removeprefix('absent: ')}" in reply["error"], api
        agent.stop()
        agent = start_agent([_copy(tmp_path / "again", "gpuinfo",
                                   {"GPUINFO_RUN_WITHOUT_GPU": "1"})])
    job = agent.run_job("squares", payload, module="gpuinfo")
    assert job["state"] == "succeeded", agent.why(job)
    result = job["result"]
    assert result["payload"] == {"total": 14}
    prov = result["provenance"]
    assert prov["platform"] == platform
    assert prov["gpu_apis_host"] == sorted(gpu["apis"])


def test_reel_checkpoints_on_the_events_file_the_agent_passes(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    # reel declares upstream's `checkpoint` capability; nine frames, a checkpoint every four:
    # Checkpoints.write announces each on --events (without the file it raises).
    agent = start_agent([_copy(tmp_path, "reel")])
    job = agent.run_job("render", {"frames": 9, "seed": 3, "every": 4}, module="reel")
    assert job["state"] == "succeeded", agent.why(job)
    assert job["result"]["payload"]["frames"] == 9
    checkpoints = [e for e in job["events"]["events"] if e.get("kind") == "checkpoint"]
    assert [e["data"] for e in checkpoints] == [{"next": 4}, {"next": 8}], job
