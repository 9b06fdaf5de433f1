"""A test runner whose child leaves the attempt's process group: the child calls setsid() and
forks a grandchild that sleeps (in that new session, so not in the runner's group). The
grandchild writes {"pid", "sid", "pgid", "runner_pgid"} to
<module data>/escapee-<attempt id>.json before the runner goes on. Payload: hold_s (attempt 1
only: the runner then sleeps this long before it writes its result). Standard library only."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def main() -> int:
    args = sys.argv[1:]
    spec = json.loads(Path(args[args.index("--spec") + 1]).read_text())
    out = Path(args[args.index("--out") + 1])
    attempt = os.environ["OARBANK_ATTEMPT_ID"]
    info = Path(os.environ["OARBANK_WORKDIR"]) / f"escapee-{attempt}.json"  # writable
    runner_pgid = os.getpgid(0)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        os.setsid()  # out of the runner's process group (and session)
        if os.fork() == 0:
            write_json(info, {"pid": os.getpid(), "sid": os.getsid(0), "pgid": os.getpgid(0),
                              "runner_pgid": runner_pgid})
            os.write(w, b"x")
            os.close(w)
            time.sleep(600)
        os._exit(0)
    os.close(w)
    os.waitpid(child, 0)
    os.read(r, 1)  # the grandchild's record is written
    os.close(r)
    hold = float(spec["payload"].get("hold_s", 0))
    if hold and attempt.endswith(".1"):
        time.sleep(hold)
    write_json(out, {"envelope": 1, "payload": {"escapee": json.loads(info.read_text())}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
