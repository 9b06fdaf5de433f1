"""What the launcher adds to a process start: ``python -m oarbank_sdk.sandbox._bench [N] [OLD]``.

Runs ``python -I -c pass`` N times plain and N times inside ``wrap`` (with the walls an agent
gives a runner: a folder to read, one to write, the agent's pid guarded), interleaved, and
prints the medians and their difference in milliseconds. With OLD (the ``src`` folder of
another checkout of the SDK, e.g. ``git worktree add /tmp/old HEAD~5`` then
``/tmp/old/sdk/src``) that version's launcher is timed in the same loop, side by side (it is
given only ``--net none``, which every version accepts). A benchmark, not a test.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from . import LAUNCHER_BOOT, _import_dirs, wrap

__all__ = ["measure"]


def measure(n: int = 10, old_src: str | None = None) -> dict[str, float]:
    child = [sys.executable, "-I", "-c", "pass"]
    read, write = tempfile.mkdtemp(), tempfile.mkdtemp()
    try:
        runs = {"plain": child,
                "sandboxed": wrap(child, read=[read], write=[write], guard_pids=[os.getpid()])}
        dirs = _import_dirs()
        if old_src and dirs:
            runs["old"] = [sys.executable, "-I", "-S", "-c", LAUNCHER_BOOT, old_src, dirs[1],
                           "--net", "none", "--", *child]
        times: dict[str, list[float]] = {k: [] for k in runs}
        for _ in range(n):
            for name, argv in runs.items():
                t0 = time.perf_counter()
                subprocess.run(argv, check=True)
                times[name].append((time.perf_counter() - t0) * 1000)
    finally:
        shutil.rmtree(read, ignore_errors=True)
        shutil.rmtree(write, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"plain_ms": round(med["plain"], 1), "sandboxed_ms": round(med["sandboxed"], 1),
           "added_ms": round(med["sandboxed"] - med["plain"], 1)}
    if "old" in med:
        out["old_sandboxed_ms"] = round(med["old"], 1)
        out["old_added_ms"] = round(med["old"] - med["plain"], 1)
        out["added_vs_old_ms"] = round(med["sandboxed"] - med["old"], 1)
    return out


if __name__ == "__main__":
    print(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 10,
                  sys.argv[2] if len(sys.argv) > 2 else None))
