"""A module that bundles its own libraries next to its scripts (tests/test_factory.py): every
process it has (each op, the daemon, the runner's run and doctor) records which copy of each
library it imported, and whether the factory ran it in place.

``service <op>`` answers the ops of a non-endpoint service whose daemon (``service serve``,
started by the start op) only stays up; ``runner run ...`` and ``runner doctor --json`` are
the runner. The stand-ins (``oarbank_sdk`` with ``oarbank_sdk.sandbox``, ``pyseccomp``, maybe
a ``dataclasses``) are written next to this file by the test, each with ``MARK = "bundled"``;
a library that is not bundled records ``MARK`` None and where it came from. Records go to
``libs.jsonl`` where each may write: the module's data folder (ops, daemon), the runner's
workdir (run) and the doctor's scratch workdir (``<state>/run/doctor/<module>``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # what a module that bundles its libraries does (-I leaves it off)

import dataclasses  # noqa: E402  (the stdlib's, unless the test bundles one)

import pyseccomp  # noqa: E402  (another library the factory holds)

import oarbank_sdk  # noqa: E402
import oarbank_sdk.sandbox  # noqa: E402  (nested: the factory holds ours)

LIBS = {"oarbank_sdk": oarbank_sdk, "oarbank_sdk.sandbox": oarbank_sdk.sandbox,
        "pyseccomp": pyseccomp, "dataclasses": dataclasses}


def in_place() -> bool:
    """Run by the factory's child in place: the outermost frame is not this script's."""
    f = sys._getframe()
    while f.f_back is not None:
        f = f.f_back
    return f.f_code.co_filename != __file__


def record(what: str, where: str) -> None:
    line = json.dumps({"what": what, "pid": os.getpid(), "in_place": in_place(),
                       "libs": {n: [getattr(m, "MARK", None), m.__file__]
                                for n, m in LIBS.items()}}) + "\n"
    fd = os.open(os.path.join(where, "libs.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def data(name: str) -> str:
    return os.path.join(os.environ["OARBANK_MODULE_DATA"], name)


def daemon_pid() -> int | None:
    try:
        with open(data("daemon.pid")) as f:
            pid = int(f.read())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def op(name: str) -> int:
    record(f"op {name}", os.environ["OARBANK_MODULE_DATA"])
    pid = daemon_pid()
    if name == "fingerprint":
        out: dict[str, object] = {"service_protocol": {"supported": [1]}, "health": "healthy",
                                  "pools": {"echo": 2}, "reserve": {"mem_gb": 0.1},
                                  "running": pid is not None}
    elif name == "start":
        if pid is None:
            with open(data("daemon.log"), "ab") as log:
                p = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "service",
                                      "serve"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            with open(data("daemon.pid"), "w") as f:
                f.write(str(p.pid))
        out = {"ok": True}
    elif name == "stop":
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while daemon_pid() is not None and time.monotonic() < deadline:
                time.sleep(0.02)
        out = {"ok": True}
    elif name in ("ready", "status"):
        ready = pid is not None and os.path.exists(data(f"ready.{pid}"))
        out = {"running": pid is not None, "ready": ready}
    elif name == "list_owned":
        out = {"objects": []}
    else:
        print(f"unknown op {name}", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


def serve() -> int:
    record("daemon", os.environ["OARBANK_MODULE_DATA"])
    open(data(f"ready.{os.getpid()}"), "w").close()
    while True:
        time.sleep(3600)


def runner(args: list[str]) -> int:
    if args[:2] == ["doctor", "--json"]:
        record("runner doctor", os.environ["OARBANK_WORKDIR"])  # its scratch workdir
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": [], "checks": []}))
        return 0
    record("runner run", os.environ["OARBANK_WORKDIR"])
    out = args[args.index("--out") + 1]
    with open(out, "w") as f:
        json.dump({"envelope": 1, "payload": {"ok": True}}, f)
    return 0


if __name__ == "__main__":
    role, rest = sys.argv[1], sys.argv[2:]
    if role == "runner":
        sys.exit(runner(rest))
    sys.exit(serve() if rest == ["serve"] else op(rest[0]))
