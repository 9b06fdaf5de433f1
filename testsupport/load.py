"""Background load for the flake hunt: CPU spinners and disk writers, as a busy CI machine has.

``python -m testsupport.load --cpu N --io M --dir D`` runs until its process group is killed
(``testsupport.flakes`` starts it in a session of its own and kills that). A spinner burns a core in a tight
loop; a writer writes 8 MiB files under ``D`` and fsyncs each, so that the tests' own file
writes and process starts wait on the disk as they would on a loaded machine.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
from pathlib import Path

WRITE_MB = 8


def spin() -> None:
    n = 0
    while True:
        n = (n * 1103515245 + 12345) & 0xFFFFFFFF


def write(folder: str) -> None:
    block = os.urandom(1 << 20)
    path = Path(folder) / f"load-{os.getpid()}"
    while True:
        with open(path, "wb") as f:
            for _ in range(WRITE_MB):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        path.unlink()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m testsupport.load")
    parser.add_argument("--cpu", type=int, default=os.cpu_count() or 1, help="spinning processes")
    parser.add_argument("--io", type=int, default=1, help="processes writing and fsyncing files")
    parser.add_argument("--dir", required=True, help="where the writers write")
    args = parser.parse_args()
    workers = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.cpu)]
    workers += [multiprocessing.Process(target=write, args=(args.dir,), daemon=True)
                for _ in range(args.io)]
    for w in workers:
        w.start()
    while True:
        signal.pause()  # whoever started us ends the whole group


if __name__ == "__main__":
    raise SystemExit(main())
