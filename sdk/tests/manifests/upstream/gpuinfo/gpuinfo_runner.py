"""Stand-in for upstream's gpuinfo runner, written here: it imports what upstream's imports
(``from oarbank_sdk import gpu, platform as pf``) and answers ``run`` and ``doctor --json`` the
same way, with one difference: on a node whose GPU APIs it cannot reach it still writes its
result (naming none), unless the payload says ``"require_gpu": true`` (then exit 3, a host
fault, as upstream's always does); and with ``GPUINFO_RUN_WITHOUT_GPU=1`` in its environment
(``[runner].env``) its doctor says healthy with no API reached, so a test's agent on a machine
without a GPU admits its job (upstream's says ``undetected`` there, as this one does otherwise).

The result names the platform (``pf.current()``) and the APIs ``gpu.detect()`` reached.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from oarbank_sdk import gpu
from oarbank_sdk import platform as pf
from oarbank_sdk.control import replace_text

WANTED = {"darwin": ["metal"], "windows": ["cuda", "rocm", "vulkan", "opencl", "directml"]}
WANTED_ELSEWHERE = ["cuda", "rocm", "vulkan", "opencl"]


def reached():
    found = gpu.detect()
    wanted = WANTED.get(pf.os_(), WANTED_ELSEWHERE)
    return [api for api in wanted if api in found["host"]], found


def run(spec_file, workdir, out):
    payload = json.loads(Path(spec_file).read_text(encoding="utf-8")).get("payload") or {}
    numbers = payload.get("numbers")
    if not isinstance(numbers, list) or any(type(n) is not int for n in numbers):
        replace_text(Path(workdir) / "failure.json", json.dumps(
            {"reason": "gpuinfo/bad_spec", "detail": f"numbers must be integers, got {numbers!r}"}))
        return 2
    apis, found = reached()
    if not apis and payload.get("require_gpu"):
        replace_text(Path(workdir) / "failure.json", json.dumps(
            {"reason": "gpuinfo/no_gpu_api", "fault": "host",
             "detail": json.dumps(found["evidence"])[:900]}))
        return 3
    replace_text(out, json.dumps({
        "envelope": 1, "schema": "gpuinfo/result@1", "module_version": "0.1.0", "protocol": 1,
        "payload": {"total": sum(n * n for n in numbers)},
        "provenance": {"platform": pf.current(), "gpu_apis_host": found["host"],
                       "gpu_api": apis[0] if apis else None,
                       "device": found["evidence"][apis[0]] if apis else None}}))
    return 0


def doctor():
    apis, found = reached()
    checks = [{"name": f"gpu api {api}", "ok": api in apis, "detail": found["evidence"].get(api, "")}
              for api in WANTED.get(pf.os_(), WANTED_ELSEWHERE)]
    healthy = bool(apis) or os.environ.get("GPUINFO_RUN_WITHOUT_GPU") == "1"
    print(json.dumps({"runner_protocol": {"supported": [1]},
                      "health": "healthy" if healthy else "undetected", "capabilities": [],
                      "checks": checks, "attrs": {"platform": pf.current(), "gpu_apis": apis}}))
    return 0


def main():
    parser = argparse.ArgumentParser()
    verbs = parser.add_subparsers(dest="verb", required=True)
    r = verbs.add_parser("run")
    for flag in ("--spec", "--workdir", "--out"):
        r.add_argument(flag, required=True)
    r.add_argument("--events")
    verbs.add_parser("doctor").add_argument("--json", action="store_true")
    args = parser.parse_args()
    return doctor() if args.verb == "doctor" else run(args.spec, args.workdir, args.out)


if __name__ == "__main__":
    sys.exit(main())
