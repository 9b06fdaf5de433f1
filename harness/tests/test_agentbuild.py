"""An upgrade's agent (harness/nodes/agentbuild.py): a wheel of this checkout's agent at another
version, installed in a venv of its own, is the agent a local node runs once installed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from harness_test_helpers import ECHO, ECHO_ID

from harness.nodes.agentbuild import install_agent_version
from harness.nodes.backends.local import LocalBackend
from harness.nodes.buildenv import DISTS, build_requires


def test_the_installed_version_is_the_one_that_runs(tmp_path: Path) -> None:
    exe = install_agent_version(tmp_path / "up", "9.8.7")
    r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("oarbank-agent 9.8.7 "), r
    # Its own copy, not this checkout's editable one.
    r = subprocess.run([str(exe.parent / "python"), "-I", "-c",
                        "import oarbank_agent; print(oarbank_agent.__file__)"],
                       capture_output=True, text=True, timeout=60)
    assert r.stdout.strip().startswith(str(tmp_path / "up" / "venv")), r


def test_a_local_node_runs_the_installed_agent(tmp_path: Path) -> None:
    backend = LocalBackend()
    node = backend.make_node("up1", tmp_path / "up1", [ECHO], {}, None)
    try:
        node.start_agent()
        assert node.status()["agent_version"] != "9.8.8"
        assert node.install_agent("9.8.8") is None
        assert node.stop_agent() == 0
        node.start_agent()
        assert node.status()["agent_version"] == "9.8.8"
        rec = node.submit(ECHO_ID, "echo", {"x": 1}, wait=True, timeout_s=60)
        assert rec["state"] == "succeeded", rec
        assert node.stop_agent() == 0
    finally:
        node.cleanup()
    assert backend.leftovers() == []


def test_the_build_venv_holds_what_the_build_system_tables_require(tmp_path: Path) -> None:
    """The wheels are built with what each pyproject.toml's [build-system] lists (no
    setuptools is assumed of the harness's venv: 3.12+ venvs have none); a table without its
    list is refused, naming the file."""
    for dist, requires in zip(DISTS, (["setuptools>=61"], ["setuptools>=61", "x"], ["y"]), strict=True):
        (tmp_path / dist).mkdir()
        (tmp_path / dist / "pyproject.toml").write_text(
            f"[build-system]\nrequires = {requires!r}\nbuild-backend = 'b'\n")
    assert build_requires(tmp_path) == ["setuptools>=61", "x", "y"]
    (tmp_path / "agent" / "pyproject.toml").write_text("[project]\nname = 'a'\n")
    with pytest.raises(RuntimeError, match=r"agent/pyproject.toml: \[build-system\] requires"):
        build_requires(tmp_path)
