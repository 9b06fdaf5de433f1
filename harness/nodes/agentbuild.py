"""Another version of the agent, built and installed as an operator upgrading a node would:
this checkout's agent package with its version set to ``version``, built into a wheel and
installed (not editable) into a venv of its own. The wheel is built in ``buildenv``'s venv
(what agent/pyproject.toml's [build-system] requires). The agent's dependencies (the SDK,
psutil, pyseccomp) come from the harness's venv, so no index is needed. The wheel alone is what
a container node installs over its own agent (it is pure Python)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from harness.nodes.buildenv import build_python

__all__ = ["build_agent_wheel", "install_agent_version"]

AGENT = Path(__file__).resolve().parents[2] / "agent"


def _versioned_copy(dest: Path, version: str) -> Path:
    src = dest / "src-tree"
    shutil.rmtree(src, ignore_errors=True)
    shutil.copytree(AGENT, src, ignore=shutil.ignore_patterns(
        "__pycache__", "*.egg-info", "build", "tests", ".*"))
    pyproject = src / "pyproject.toml"
    text, n = re.subn(r'(?m)^version = "[^"]*"$', f'version = "{version}"',
                      pyproject.read_text(), count=1)
    if n != 1:
        raise RuntimeError(f"{pyproject}: no version line to set")
    pyproject.write_text(text)
    return src


_PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def _run(cmd: list[str], timeout_s: float) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-1500:]}")


def build_agent_wheel(dest: Path, version: str, timeout_s: float = 300.0) -> Path:
    """This checkout's agent as a wheel of version ``version``, under ``dest``/wheels."""
    dest.mkdir(parents=True, exist_ok=True)
    src = _versioned_copy(dest, version)
    wheels = dest / "wheels"
    _run([str(build_python(timeout_s)), *_PIP[1:], "wheel", "--no-deps", "--no-build-isolation",
          "--no-index", "-q", "-w", str(wheels), str(src)], timeout_s)
    (wheel,) = wheels.glob(f"oarbank_agent-{version}-*.whl")
    return wheel


def install_agent_version(dest: Path, version: str, timeout_s: float = 300.0) -> Path:
    """The ``oarbank-agent`` console script of agent ``version``, installed under ``dest``."""
    wheel = build_agent_wheel(dest, version, timeout_s)
    venv = dest / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], timeout_s)
    py = venv / "bin" / "python"
    _run([*_PIP, "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)],
         timeout_s)
    # The dependencies: the harness venv's site-packages after the new venv's own (so its
    # oarbank_agent, and its version's metadata, are the ones found first).
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path("
                                "'purelib'))"], capture_output=True, text=True, check=True,
                               timeout=60).stdout.strip())
    ours = sysconfig.get_path("purelib")
    (site / "zz_harness_deps.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n")
    exe = venv / "bin" / "oarbank-agent"
    if not exe.exists():
        raise RuntimeError(f"{exe}: not installed")
    return exe
