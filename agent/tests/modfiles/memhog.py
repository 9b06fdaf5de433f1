"""Real memory pressure for the host-protection tests: allocate and touch memory in chunks
until the host's available memory is below a target, then hold it until told to stop.

    python memhog.py TARGET_AVAILABLE_BYTES CAP_BYTES [CHUNK_BYTES]

Prints one JSON line per event on stdout: {"event": "crossed", "t", "allocated",
"available"} once available memory is under the target (or {"event": "cap", ...} if the cap
was reached first, in which case it stops allocating). Then it holds what it has until stdin
is closed (or a line arrives) and exits, which gives everything back. It never allocates more
than CAP_BYTES, so a test can bound it by what the machine has.
"""

from __future__ import annotations

import json
import sys
import time

import psutil

PAGE = 4096


def say(event: str, **kw: object) -> None:
    print(json.dumps({"event": event, "t": time.time(), **kw}), flush=True)


def main() -> int:
    target, cap = int(sys.argv[1]), int(sys.argv[2])
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 64 << 20
    held: list[bytearray] = []
    allocated = 0
    while True:
        available = psutil.virtual_memory().available
        if available < target:
            say("crossed", allocated=allocated, available=available)
            break
        if allocated + chunk > cap:
            say("cap", allocated=allocated, available=available)
            break
        buf = bytearray(chunk)
        buf[::PAGE] = b"\x01" * len(range(0, chunk, PAGE))  # touch every page: resident now
        held.append(buf)
        allocated += chunk
    sys.stdin.readline()  # hold until the test says so (or goes away)
    held.clear()
    say("freed", allocated=allocated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
