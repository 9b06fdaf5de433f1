"""Another version of the agent, built and installed as an operator upgrading a node would:
this checkout's agent package with its version set to ``version``, built into a wheel and
installed (not editable) into a venv of its own. The agent's dependencies (the SDK, psutil,
pyseccomp) come from the harness's venv, so no index is needed."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

__all__ = ["install_agent_version"]

AGENT = Path(__file__).resolve().parent.parent / "agent"


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


def install_agent_version(dest: Path, version: str, timeout_s: float = 300.0) -> Path:
    """The ``oarbank-agent`` console script of agent ``version``, installed under ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    src = _versioned_copy(dest, version)
    wheels = dest / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]

    def run(cmd: list[str]) -> None:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {r.returncode}: {r.stderr[-1500:]}")

    run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(wheels), str(src)])
    (wheel,) = wheels.glob(f"oarbank_agent-{version}-*.whl")
    venv = dest / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)])
    py = venv / "bin" / "python"
    run([*pip, "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)])
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
