"""A test runner for fate sharing and collection after a restart: it does its "work" and says
so in <workdir>/fate.jsonl ({"event": "start" | "finished", "pid", "child"?, "t"}).

Payload (all optional): grandchild (start a sleeping child in the runner's process group and
record its pid), work_s (sleep before finishing: mid-work), finish ("result", default: write
result.json atomically; "failure": failure.json with fault "job"; attempt 2 and later always
write the result), linger_s (after writing, sleep before exiting 0 or 2: finished, not yet
exited). Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path


def note(workdir: Path, event: str, **kw: object) -> None:
    with open(workdir / "fate.jsonl", "a") as f:
        f.write(json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **kw}) + "\n")


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def main() -> int:
    args = sys.argv[1:]
    if args[:2] == ["doctor", "--json"]:
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": []}))
        return 0
    spec = json.loads(Path(args[args.index("--spec") + 1]).read_text())
    workdir = Path(args[args.index("--workdir") + 1])
    out = Path(args[args.index("--out") + 1])
    payload = spec["payload"]
    child = None
    if payload.get("grandchild"):
        child = subprocess.Popen([sys.executable, "-I", "-c", "import time; time.sleep(600)"],
                                 stdin=subprocess.DEVNULL).pid
    note(workdir, "start", child=child)
    first = spec["attempt_id"].endswith(".1")  # the pauses are the first attempt's only
    time.sleep(float(payload.get("work_s", 0)) if first else 0)
    failing = payload.get("finish") == "failure" and first
    if failing:
        write_json(workdir / "failure.json",
                   {"reason": "told_to_fail", "detail": "the payload said so", "fault": "job"})
    else:
        write_json(out, {"envelope": 1, "payload": {"attempt": spec["attempt_id"]}})
    note(workdir, "finished")
    time.sleep(float(payload.get("linger_s", 0)) if first else 0)
    return 2 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
