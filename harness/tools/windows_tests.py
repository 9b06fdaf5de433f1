"""Tests under Windows' own CPython in Wine (`nox -s windows`).

    python -m harness.tools.windows_tests [--cpython X.Y] [--prepare-only] [PYTEST ARGS...]

With no pytest arguments it runs the SDK's tests; `--prepare-only` prepares Wine, the
embeddable CPython, its wheels and the prefix (harness/nodes/wine.py) and prints the command that
runs python.exe. Exit 2 when this machine lacks something for the run, saying what.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from harness.nodes.wine import REPO, WineError, end_wine, prepare


def run_python(args: list[str], *, cwd: Path = REPO, timeout: float | None = None) -> int:
    """Run Windows' python.exe with ``args``; its output comes through a pipe (never a regular
    file: python.exe dies at start on one) and is copied to ours. The copy stops at its exit,
    not at end of file: a Wine service (winedevice.exe) started on its behalf may hold the
    pipe's write end for as long as the wineserver lives."""
    cmd, env = prepare()
    proc = subprocess.Popen([*cmd, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    out = proc.stdout

    def copy() -> None:
        for chunk in iter(lambda: out.read1(65536), b""):
            sys.stdout.buffer.write(chunk.replace(b"\r\n", b"\n"))
            sys.stdout.buffer.flush()

    copier = threading.Thread(target=copy, daemon=True)
    copier.start()
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        copier.join(timeout=2.0)  # what it wrote last, then leave the pipe to whoever holds it


SDK_TESTS = ["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
             "--continue-on-collection-errors", "sdk/tests"]


def main(argv: list[str]) -> int:
    if argv[:1] == ["--cpython"] and len(argv) > 1:
        os.environ["OARBANK_WINDOWS_PYTHON"] = argv[1]  # seen by prepare() and by the tests' agents
        argv = argv[2:]
    try:
        if argv[:1] == ["--prepare-only"]:
            cmd, _ = prepare()
            print("ready:", " ".join(cmd))
            return 0
        args = ["-m", "pytest", "-p", "no:cacheprovider", *argv] if argv else SDK_TESTS
        try:
            return run_python(args)
        finally:
            end_wine()
    except WineError as exc:
        print(f"harness.tools.windows_tests: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
