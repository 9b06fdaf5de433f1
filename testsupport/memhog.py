"""Real memory pressure for the host-protection tests and the yield scenario: allocate and
touch memory in chunks until the host's available memory is below a target, then hold it
until told to stop.

    python memhog.py TARGET_AVAILABLE_BYTES CAP_BYTES [--chunk BYTES] [--rest REST_BYTES]

Prints one JSON line per event on stdout: {"event": "crossed", "t", "allocated",
"available"} once available memory is under the target (or {"event": "cap", ...} if the cap
was reached first, in which case it stops allocating). Then it holds what it has until stdin
is closed (or a line arrives) and exits, which gives everything back. While it holds, it keeps
available memory under the target (checked every 0.1 s): other work on the machine (parallel
test workers) freeing memory would otherwise end the pressure before the test saw the agent
react. It never allocates more than CAP_BYTES, so a test can bound it by what the machine has.

With ``--rest``, it first brings available memory down to REST_BYTES, says {"event":
"resting"} and keeps it there (allocating when other work frees memory, freeing when other
work takes it) until a line arrives on stdin; only then does it go on to the target. Why: on
a VM whose host backs guest memory on first touch, fresh memory comes at 100-200 MB/s, so 3
GiB take 15-20 s; a test that needs the pressure to land within seconds of a moment (while
jobs still use a service) takes most of the way beforehand and only the last stretch then.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time

import psutil

PAGE = 4096
# The pytest-xdist group of every test that runs this hog: one test's pressure crosses the
# floors another test's agent set, so they never run side by side.
XDIST_GROUP = "memory_pressure"


def say(event: str, **kw: object) -> None:
    print(json.dumps({"event": event, "t": time.time(), **kw}), flush=True)


class Hog:
    def __init__(self, cap: int, chunk: int) -> None:
        self.cap, self.chunk = cap, chunk
        self.held: list[bytearray] = []

    @property
    def allocated(self) -> int:
        return len(self.held) * self.chunk

    def fill(self, target: int) -> tuple[str, int]:
        """Allocate until available memory is under the target: ("crossed", available), or
        ("cap", available) when the cap comes first."""
        while True:
            available = psutil.virtual_memory().available
            if available < target:
                return "crossed", available
            if self.allocated + self.chunk > self.cap:
                return "cap", available
            buf = bytearray(self.chunk)
            buf[::PAGE] = b"\x01" * len(range(0, self.chunk, PAGE))  # touch every page
            self.held.append(buf)

    def give_back_to(self, floor: int) -> None:
        """Free chunks while available memory is under `floor` (freed chunks are unmapped at
        once: large bytearrays are their own mappings)."""
        while self.held and psutil.virtual_memory().available < floor:
            self.held.pop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("target", type=int)
    ap.add_argument("cap", type=int)
    ap.add_argument("--chunk", type=int, default=64 << 20)
    ap.add_argument("--rest", type=int, default=None)
    args = ap.parse_args()
    hog = Hog(args.cap, args.chunk)
    told: queue.Queue[str] = queue.Queue()  # "line" per line on stdin, "end" at its end

    def listen() -> None:
        while sys.stdin.readline():
            told.put("line")
        told.put("end")

    def wait_told() -> str | None:
        try:
            return told.get(timeout=0.1)
        except queue.Empty:
            return None

    threading.Thread(target=listen, daemon=True).start()
    if args.rest is not None:
        _, available = hog.fill(args.rest)
        say("resting", allocated=hog.allocated, available=available)
        while (word := wait_told()) is None:  # hold the resting level, within a chunk
            hog.fill(args.rest + hog.chunk)
            hog.give_back_to(args.rest - hog.chunk)
        if word == "end":
            say("freed", allocated=hog.allocated)
            return 0
    event, available = hog.fill(args.target)
    say(event, allocated=hog.allocated, available=available)
    while wait_told() is None:
        if event == "crossed":  # keep the pressure, up to the cap, whatever else frees meanwhile
            event, _ = hog.fill(args.target)
    allocated = hog.allocated
    hog.held.clear()
    say("freed", allocated=allocated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
