"""What the launcher adds to a process start: ``python -m oarbank_sdk.sandbox._bench [N]``.

Runs ``python -I -c pass`` N times plain and N times inside ``wrap``, interleaved, and prints
the medians and their difference in milliseconds. A benchmark, not a test.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

from . import wrap

__all__ = ["measure"]


def measure(n: int = 10) -> dict[str, float]:
    child = [sys.executable, "-I", "-c", "pass"]
    plain: list[float] = []
    wrapped: list[float] = []
    for _ in range(n):
        for argv, into in ((child, plain), (wrap(child), wrapped)):
            t0 = time.perf_counter()
            subprocess.run(argv, check=True)
            into.append((time.perf_counter() - t0) * 1000)
    p, w = statistics.median(plain), statistics.median(wrapped)
    return {"plain_ms": round(p, 1), "sandboxed_ms": round(w, 1), "added_ms": round(w - p, 1)}


if __name__ == "__main__":
    print(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 10))
