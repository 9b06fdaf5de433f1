"""A service that cannot start: every `start` records the attempt and fails with a reason.

Files in the module data dir: `start.attempts`, one line per `start` the agent ran.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

REASON = "model weights missing: /weights/model.bin not found"


def main(argv: list[str]) -> int:
    if argv[:2] == ["runner", "doctor"]:  # the runner is fine: the service is what crashes
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": []}))
        return 0
    op = argv[-1] if argv else ""
    data = Path(os.environ.get("OARBANK_MODULE_DATA", "."))
    data.mkdir(parents=True, exist_ok=True)
    if op == "fingerprint":
        print(json.dumps({"service_protocol": {"supported": [1]}, "health": "healthy",
                          "pools": {"model": 2}, "reserve": {"mem_gb": 0}, "running": False}))
        return 0
    if op == "start":
        with open(data / "start.attempts", "a", encoding="utf-8") as f:
            f.write(f"{time.time():.3f}\n")
        print(REASON, file=sys.stderr)
        return 1
    if op in ("status", "ready"):
        print(json.dumps({"running": False, "ready": False}))
        return 0
    if op == "stop":
        print(json.dumps({"ok": True}))
        return 0
    if op == "list_owned":
        print(json.dumps({"objects": []}))
        return 0
    if op == "destroy":
        print(json.dumps({"ok": True}))
        return 0
    if op == "runner" or "run" in argv:
        print("crashy: no job can run: the service never starts", file=sys.stderr)
        return 1
    print(f"crashy.py: unknown op {op!r}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
