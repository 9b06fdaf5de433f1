"""Module environments (modules/envs.py, contract section 4): a module's own pinned libraries,
installed from its bundled wheels offline inside the sandbox, are what its ops, daemon, doctor
and runner import; ``python`` in ``exec`` is that environment's interpreter. Real agents, real
pip, real wheels (a pure-Python library and numpy's binary wheel) from the machine's index."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from agent_helpers import MODFILES, RunningAgent, read_jsonl, write_module  # noqa: E402
from env_wheels import bundle_wheels, version_of, wheel  # noqa: E402

PROBE = ["python", "-I", "{bundle}/env_probe.py"]


def probe_module(root: Path, module_id: str, wheels: list[Path], libs: list[str]) -> Path:
    mod = write_module(root, module_id=module_id,
                       service={"exec": [*PROBE, "service"], "endpoint": False},
                       runner={"exec": [*PROBE, "runner"]})
    shutil.copy(MODFILES / "env_probe.py", mod / "env_probe.py")
    (mod / "libs.txt").write_text("".join(n + "\n" for n in libs))
    bundle_wheels(mod, wheels)
    return mod


def rows(agent: RunningAgent, module: str, job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = [*read_jsonl(agent.module_data(module) / "env.jsonl"),
             *read_jsonl(agent.state_dir / "jobs" / job["job_id"] / "a1" / "env.jsonl"),
             *read_jsonl(agent.state_dir / "run" / "doctor" / module / "env.jsonl")]
    return {r["what"]: r for r in found}


@pytest.mark.linux_only("runs under --sandbox required: the Linux launcher's walls")
def test_a_module_runs_its_service_and_runner_in_its_own_environment(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """six (pure Python) and numpy (a binary wheel), neither of which the agent has: the ops,
    the daemon they start, the doctor and the run each import them from the module's
    environment, under the sandbox; the host's SDK is seen from it; status names the env.
    Building it tries no socket (the sandbox would refuse it and the agent say so)."""
    for name in ("six", "numpy"):
        with pytest.raises(ImportError):
            __import__(name)  # (the agent's own interpreter lacks them: the test means it)
    six, numpy = wheel("six", "1.17.0"), wheel("numpy")
    mod = probe_module(tmp_path / "mod", "test.env.one", [six, numpy], ["six", "numpy"])
    agent = start_agent([mod], extra_args=["--sandbox", "required"])
    job = agent.run_job("echo", {}, module="test.env.one")
    assert job["state"] == "succeeded", agent.why(job)
    envs = agent.status()["module_envs"]["test.env.one"]
    (digest,) = envs.values()
    assert list(envs) == ["requirements.txt"]
    env = agent.state_dir / "envs" / digest
    assert (env / ".ready").exists()
    seen = rows(agent, "test.env.one", job)
    assert {"op fingerprint", "op start", "daemon", "runner doctor", "runner run"} <= set(seen)
    for what, r in seen.items():
        assert r["exe"] == str(env / "bin" / "python") and r["prefix"] == str(env), (what, r)
        assert r["libs"]["six"][0] == version_of(six), (what, r)
        assert r["libs"]["numpy"][0] == version_of(numpy), (what, r)
        for _, file in r["libs"].values():
            assert file.startswith(str(env) + "/"), (what, file)
        assert r["numpy_sum"] == 45
        assert not r["sdk"].startswith(str(env)), r["sdk"]  # the host's SDK
    assert job["result"]["payload"]["libs"]["six"][0] == version_of(six)
    assert "the sandbox refused" not in agent.log(), agent.log()[-3000:]


@pytest.mark.linux_only("runs under --sandbox required: the Linux launcher's walls")
def test_two_modules_pinning_different_versions_run_side_by_side(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """six 1.16.0 and 1.17.0 on one node, each module its own; a third module with the first
    one's pins shares its environment (one build); none changes another's."""
    old, new = wheel("six", "1.16.0"), wheel("six", "1.17.0")
    a = probe_module(tmp_path / "a", "test.env.a", [old], ["six"])
    b = probe_module(tmp_path / "b", "test.env.b", [new], ["six"])
    c = probe_module(tmp_path / "c", "test.env.c", [old], ["six"])
    agent = start_agent([a, b, c], extra_args=["--sandbox", "required"])
    versions = {}
    for m in ("test.env.a", "test.env.b", "test.env.c"):
        job = agent.run_job("echo", {}, module=m)
        assert job["state"] == "succeeded", agent.why(job)
        versions[m] = job["result"]["payload"]["libs"]["six"][0]
    assert versions == {"test.env.a": "1.16.0", "test.env.b": "1.17.0", "test.env.c": "1.16.0"}
    envs = agent.status()["module_envs"]
    assert envs["test.env.a"] == envs["test.env.c"] != envs["test.env.b"]
    assert len([p for p in (agent.state_dir / "envs").iterdir() if p.is_dir()]) == 2


def test_a_malformed_requirements_line_refuses_the_module_naming_the_line(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """An unhashed pin: refused at load with the file and line; nothing installed. A wheel
    for another platform only (check cannot know): the installer's reason refuses it."""
    six = wheel("six", "1.17.0")
    bad = probe_module(tmp_path / "bad", "test.env.bad", [six], ["six"])
    (bad / "requirements.txt").write_text("# ok\nsix==1.17.0\n")
    other = probe_module(tmp_path / "other", "test.env.other", [six], ["six"])
    foreign = other / "wheels" / six.name.replace("py2.py3-none-any", "cp27-cp27m-win32")
    (other / "wheels" / six.name).rename(foreign)
    good = probe_module(tmp_path / "good", "test.env.good", [six], ["six"])
    agent = start_agent([bad, other, good])
    refused = agent.status()["modules_refused"]
    why = next(v for k, v in refused.items() if "bad" in k)
    assert "requirements.txt line 2" in why and "--hash" in why, why
    assert "cannot install its environment" in refused["test.env.other"], refused
    assert "six==1.17.0" in refused["test.env.other"], refused
    job = agent.run_job("echo", {}, module="test.env.good")
    assert job["state"] == "succeeded", job
    # only the good module's environment is left (the failed build removed)
    assert len([p for p in (agent.state_dir / "envs").iterdir() if p.is_dir()]) == 1


def test_an_unused_environment_goes_after_its_grace_period(tmp_path: Path) -> None:
    """``Envs.sweep``: marked when first unused, removed once unused for ``grace_s``; one in
    use is kept, and its mark cleared (used again, its grace starts anew)."""
    from oarbank_agent.modules import envs
    from oarbank_agent.procs import ProcessRegistry

    box = envs.Envs(tmp_path, ProcessRegistry(tmp_path), grace_s=60)
    for name in ("used", "unused"):
        (tmp_path / "envs" / name).mkdir(parents=True)
    now = time.time()
    assert box.sweep({"used"}, now) == []
    assert box.sweep({"used"}, now + 59) == []
    assert box.sweep({"used"}, now + 61) == ["unused"]
    assert sorted(p.name for p in (tmp_path / "envs").iterdir()) == ["used"]
    # used again: its grace starts anew once it is unused again
    assert box.sweep({"used"}, now) == [] and box.sweep(set(), now + 10) == []
    assert box.sweep(set(), now + 65) == []  # (marked at now + 10)
    assert box.sweep({"used"}, now + 66) == [] and box.sweep(set(), now + 200) == []
    assert box.sweep(set(), now + 261) == ["used"]


def test_concurrent_module_adds_of_the_same_pins_build_one_environment(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """Two ``module add`` at once, identical pins: one build, both modules in it, both run."""
    six = wheel("six", "1.16.0")
    mods = [probe_module(tmp_path / n, f"test.env.{n}", [six], ["six"]) for n in ("p", "q")]
    agent = start_agent([], extra_args=["--allow-empty"])
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda m: agent.cli("module", "add", str(m), "--state-dir",
                                                 str(agent.state_dir)), mods))
    assert all(d.returncode == 0 for d in done), [(d.stdout, d.stderr) for d in done]
    assert agent.log().count(" built in ") == 1, agent.log()[-3000:]
    envs = agent.status()["module_envs"]
    assert envs["test.env.p"] == envs["test.env.q"], envs
    for m in ("test.env.p", "test.env.q"):
        job = agent.run_job("echo", {}, module=m)
        assert job["state"] == "succeeded", job
        assert job["result"]["payload"]["libs"]["six"][0] == "1.16.0"


def test_a_removed_modules_environment_goes_after_the_grace_period(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """``module remove``: its environment is unused from then on, and removed at a refresh
    once ``--env-grace-s`` has passed; another module's stays."""
    gone = probe_module(tmp_path / "gone", "test.env.gone", [wheel("six", "1.16.0")], ["six"])
    kept = probe_module(tmp_path / "kept", "test.env.kept", [wheel("six", "1.17.0")], ["six"])
    agent = start_agent([gone, kept], extra_args=["--env-grace-s", "1", "--refresh-s", "0.3"])
    envs = agent.status()["module_envs"]
    (old,), (new,) = envs["test.env.gone"].values(), envs["test.env.kept"].values()
    done = agent.cli("module", "remove", "test.env.gone", "--wait", "--state-dir",
                     str(agent.state_dir))
    assert done.returncode == 0, (done.stdout, done.stderr)
    # the agent logs the sweep once the tree is gone: wait for the line, not the directory
    agent.wait_for(lambda: f"environment {old} removed: no loaded module used it" in agent.log(),
                   timeout=30, what="the removed module's environment swept")
    assert not (agent.state_dir / "envs" / old).exists()
    assert (agent.state_dir / "envs" / new / ".ready").exists()


@pytest.mark.linux_only("runs under --sandbox required: the Linux launcher's walls")
def test_the_install_runs_only_inside_the_sandbox(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    """Every launcher refusing setup (the agent's test hook): the environment's first step
    never runs unconfined, so the module is refused with the launcher's reason and no
    environment is left; installing runs nothing of the module outside the sandbox."""
    mod = probe_module(tmp_path / "mod", "test.env.walled", [wheel("six", "1.17.0")], ["six"])
    env = dict(os.environ, OARBANK_SANDBOX_FAULT="seccomp")
    agent = start_agent([mod], extra_args=["--sandbox", "required", "--allow-empty"], env=env)
    why = agent.status()["modules_refused"]["test.env.walled"]
    assert "cannot install its environment" in why and "venv failed (exit 70)" in why, why
    assert "unconfined" in why, why  # the launcher's "refusing to run ... unconfined"
    assert not [p for p in (agent.state_dir / "envs").iterdir() if p.is_dir()]


def test_status_names_the_environment_each_module_runs_in(
        tmp_path: Path, start_agent: Callable[..., RunningAgent]) -> None:
    mod = probe_module(tmp_path / "mod", "test.env.shown", [wheel("six", "1.17.0")], ["six"])
    agent = start_agent([mod])
    (digest,) = agent.status()["module_envs"]["test.env.shown"].values()
    out = agent.cli("status", "--state-dir", str(agent.state_dir)).stdout
    assert f"ENV test.env.shown requirements.txt: {agent.state_dir}/envs/{digest}" in out, out
