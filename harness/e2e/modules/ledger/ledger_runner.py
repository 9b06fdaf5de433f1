"""The chaos run's runner: a job's work is a `start <job id>` request to the model service, a
pause of the payload's `work_s`, then `done <job id>`; right after the `done` it writes
`result.json` atomically, says `recorded <job id>` (its outcome is whole: an agent started
again collects it) and exits 0. The service's ledger says how often each job's work was done,
and whether an attempt whose work was done had recorded its result. Exit 75 with
`failure.json` (fault transient) when the service cannot be reached; 2 for a bad payload.
Standard library plus `oarbank_sdk.service_endpoint`.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from oarbank_sdk import service_endpoint as ep  # noqa: E402


def write_json_atomically(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def say(what: str) -> None:
    r = ep.request("model", "POST", "/v1/generate", {"prompt": what})
    if r.status != 200:
        raise OSError(f"the service answered {r.status}")


def main(argv: list[str]) -> int:
    if argv[:2] == ["doctor", "--json"]:
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": []}))
        return 0
    spec_path, workdir, out = (argv[argv.index(k) + 1] for k in ("--spec", "--workdir", "--out"))
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    job, work_s = spec["job_id"], spec["payload"].get("work_s", 0)
    if not isinstance(work_s, (int, float)) or work_s < 0:
        write_json_atomically(os.path.join(workdir, "failure.json"), {
            "reason": "bad_payload", "detail": f"work_s must be seconds >= 0, not {work_s!r}",
            "fault": "job"})
        return 2
    try:
        say(f"start {job}")
        time.sleep(work_s)
        say(f"done {job}")
    except (ep.EndpointError, OSError) as exc:
        write_json_atomically(os.path.join(workdir, "failure.json"), {
            "reason": "service_unreachable", "detail": str(exc), "fault": "transient"})
        return 75
    write_json_atomically(out, {"envelope": 1, "payload": {"job": job, "work_s": work_s}})
    try:
        say(f"recorded {job}")
    except (ep.EndpointError, OSError):
        pass  # the job is done and its result whole: only the ledger misses the line
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
