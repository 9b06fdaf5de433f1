"""Real memory pressure for the host-protection tests: allocate and touch memory in chunks
until the host's available memory is below a target, then hold it until told to stop.

    python memhog.py TARGET_AVAILABLE_BYTES CAP_BYTES [CHUNK_BYTES]

Prints one JSON line per event on stdout: {"event": "crossed", "t", "allocated",
"available"} once available memory is under the target (or {"event": "cap", ...} if the cap
was reached first, in which case it stops allocating). Then it holds what it has until stdin
is closed (or a line arrives) and exits, which gives everything back. While it holds, it keeps
available memory under the target (checked every 0.1 s): other work on the machine (parallel
test workers) freeing memory would otherwise end the pressure before the test saw the agent
react. It never allocates more than CAP_BYTES, so a test can bound it by what the machine has.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import psutil

PAGE = 4096


def say(event: str, **kw: object) -> None:
    print(json.dumps({"event": event, "t": time.time(), **kw}), flush=True)


def main() -> int:
    target, cap = int(sys.argv[1]), int(sys.argv[2])
    chunk = int(sys.argv[3]) if len(sys.argv) > 3 else 64 << 20
    held: list[bytearray] = []

    def fill() -> tuple[str, int]:
        """Allocate until available memory is under the target: ("crossed", available), or
        ("cap", available) when the cap comes first."""
        while True:
            available = psutil.virtual_memory().available
            if available < target:
                return "crossed", available
            if (len(held) + 1) * chunk > cap:
                return "cap", available
            buf = bytearray(chunk)
            buf[::PAGE] = b"\x01" * len(range(0, chunk, PAGE))  # touch every page: resident now
            held.append(buf)

    event, available = fill()
    say(event, allocated=len(held) * chunk, available=available)
    told = threading.Event()  # stdin closed or a line: the test is done

    def listen() -> None:
        sys.stdin.readline()
        told.set()

    threading.Thread(target=listen, daemon=True).start()
    while not told.wait(0.1):
        if event == "crossed":  # keep the pressure, up to the cap, whatever else frees meanwhile
            event, _ = fill()
    allocated = len(held) * chunk
    held.clear()
    say("freed", allocated=allocated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
