"""A module whose every process records which interpreter and which copy of each library it
got (tests/test_module_envs.py): the libraries it needs are listed one a line in ``libs.txt``
beside this file, each imported (a missing one fails the process: it needs its environment).

``service <op>`` answers the ops of a non-endpoint service whose daemon (``service serve``,
started by the start op with ``sys.executable``) only stays up; ``runner run ...`` and
``runner doctor --json`` are the runner, whose result's payload is the run's record. Records go
to ``env.jsonl`` in the module data folder (ops, daemon) or the runner's workdir (run, doctor).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "libs.txt")) as _f:
    NAMES = [n.strip() for n in _f if n.strip()]
LIBS = {n: importlib.import_module(n) for n in NAMES}


def probe(what: str) -> dict:
    doc = {"what": what, "pid": os.getpid(), "exe": sys.executable, "prefix": sys.prefix,
           "libs": {n: [getattr(m, "__version__", None), m.__file__] for n, m in LIBS.items()}}
    if "numpy" in LIBS:  # its compiled part really loads and computes
        doc["numpy_sum"] = int(LIBS["numpy"].arange(10).sum())
    import oarbank_sdk  # the host's SDK, seen from the environment
    doc["sdk"] = oarbank_sdk.__file__
    return doc


def record(what: str, where: str) -> dict:
    doc = probe(what)
    fd = os.open(os.path.join(where, "env.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(doc) + "\n").encode())
    finally:
        os.close(fd)
    return doc


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
        record("runner doctor", os.environ["OARBANK_WORKDIR"])
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": [], "checks": []}))
        return 0
    doc = record("runner run", os.environ["OARBANK_WORKDIR"])
    out = args[args.index("--out") + 1]
    with open(out + ".tmp", "w") as f:
        json.dump({"envelope": 1, "payload": doc}, f)
    os.replace(out + ".tmp", out)
    return 0


if __name__ == "__main__":
    role, rest = sys.argv[1], sys.argv[2:]
    if role == "runner":
        sys.exit(runner(rest))
    sys.exit(serve() if rest == ["serve"] else op(rest[0]))
