"""Runner of the echo module: result payload = the job's payload."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    if argv[:1] == ["doctor"]:
        print(json.dumps({"ok": True}))
        return 0
    args = dict(zip(argv[1::2], argv[2::2], strict=False))
    with open(args["--spec"], encoding="utf-8") as f:
        payload = json.load(f)["payload"]
    if isinstance(payload, dict) and payload.get("escape_s"):
        # A process that leaves the attempt's group: the agent cannot end it by group.
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({payload['escape_s']})"],
                         start_new_session=True, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = args["--out"]
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"envelope": 1, "payload": payload}, f)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
