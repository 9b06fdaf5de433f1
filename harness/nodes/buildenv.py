"""Where this checkout's own wheels are built: a venv holding what the ``[build-system]``
tables of sdk/, agent/ and ui-pages/ require, installed once from this machine's configured
package index and cached (``<cache>/build-venv-<key>``; the key: the interpreter and those
requirements). Builds then run ``pip wheel --no-build-isolation`` with its interpreter: about
3 s a wheel, where pip's isolated build environment takes 5-9 s a wheel here, and nothing is
assumed of the harness's own venv (from Python 3.12 on, a venv has no setuptools)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the SDK depends on tomli there
    import tomli as tomllib

from harness.nodes.cache import cache_dir

__all__ = ["DISTS", "REPO", "build_requires", "build_python"]

REPO = Path(__file__).resolve().parents[2]
DISTS = ("sdk", "agent", "ui-pages")
# What setuptools older than 70.1 asks for besides itself to build a wheel (its
# get_requires_for_build_wheel); newer ones need nothing more and ignore it.
WHEEL_BUILD_EXTRA = "wheel"


def build_requires(repo: Path = REPO) -> list[str]:
    """Every requirement the ``[build-system]`` tables list (once each). Raises
    ``RuntimeError`` naming a pyproject.toml without a list of strings there."""
    found: list[str] = []
    for dist in DISTS:
        path = repo / dist / "pyproject.toml"
        requires = tomllib.loads(path.read_text()).get("build-system", {}).get("requires")
        if not isinstance(requires, list) or not requires \
                or not all(isinstance(r, str) for r in requires):
            raise RuntimeError(f"{path}: [build-system] requires is not a list of requirements")
        found += requires
    return list(dict.fromkeys(found))


def build_python(timeout_s: float = 600.0) -> Path:
    """The build venv's interpreter, the venv made first when this cache has none for this
    interpreter and these requirements. One maker at a time (a file lock: parallel test
    workers or a test run beside `nox -s e2e` would otherwise make it twice at once)."""
    requires = build_requires()
    # made by the interpreter itself, not by a venv's link to it: the cache outlives the venv
    # (a nox venv in a clone CI deletes), and a venv made from a venv points at its maker
    creator = os.path.realpath(sys.executable)
    key = hashlib.sha256("\0".join([creator, sys.version,
                                    *requires]).encode()).hexdigest()[:12]
    venv = cache_dir() / f"build-venv-{key}"
    py = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    done = venv / ".done"
    if done.is_file() and _runs(py):
        return py
    import fcntl  # POSIX only, like the backends that build wheels

    with open(cache_dir() / "build-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (done.is_file() and _runs(py)):  # none, half made, or its maker gone
            shutil.rmtree(venv, ignore_errors=True)
            for cmd in ([creator, "-m", "venv", str(venv)],
                        [str(py), "-m", "pip", "--disable-pip-version-check", "--no-input", "-q",
                         "install", *requires, WHEEL_BUILD_EXTRA]):
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                   stdin=subprocess.DEVNULL)
                if r.returncode != 0:
                    shutil.rmtree(venv, ignore_errors=True)
                    raise RuntimeError(f"the wheel build venv: {' '.join(cmd)}: exit "
                                       f"{r.returncode}: {(r.stdout + r.stderr)[-1500:]}")
            done.write_text("\n".join(requires) + "\n")
    return py


def _runs(py: Path) -> bool:
    try:
        return subprocess.run([str(py), "-c", ""], capture_output=True, timeout=60,
                              stdin=subprocess.DEVNULL).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
