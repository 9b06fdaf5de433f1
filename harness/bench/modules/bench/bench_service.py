"""The bench module's services (``bench`` and ``probe``): ops, and a daemon that serves
``bench_http.GenerateHandler`` on every connection the agent hands it.

``python -I bench_service.py <op>`` (contract section 2); ``OARBANK_SERVICE`` says which
service. The daemon says hello, "loads" (sleeps ``load_s`` from the settings: 0 for
``bench``, ``probe_load_s`` for ``probe`` and ``probe_polled``), appends the unix time at which
loading finished to ``<service>.loaded`` in the module data dir (the readiness figure starts
its clock there), marks itself ready (its ``ready`` op answers true), says ``ready`` on the
channel (all but ``probe_polled``, which the agent polls) and serves until the agent closes
the channel.

Standard library plus ``oarbank_sdk.service_endpoint``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))


def service() -> str:
    return os.environ.get("OARBANK_SERVICE", "bench")


def data_dir() -> Path:
    d = Path(os.environ["OARBANK_MODULE_DATA"])
    d.mkdir(parents=True, exist_ok=True)
    return d


def settings() -> dict:
    conf = {"slots": 64, "probe_load_s": 0.2}
    name = os.environ.get("OARBANK_SETTINGS_FILE")
    if name and os.path.exists(name):
        with open(name, encoding="utf-8") as f:
            conf.update(json.load(f))
    return conf


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def state() -> tuple[bool, bool]:
    d, name = data_dir(), service()
    pid = read_pid(d / f"{name}.pid")
    running = alive(pid)
    return running, running and read_pid(d / f"{name}.ready") == pid


def serve() -> int:
    sys.path.insert(0, HERE)  # -I leaves the script's folder off sys.path
    from bench_http import GenerateHandler

    from oarbank_sdk import service_endpoint as ep

    d, name, conf = data_dir(), service(), settings()
    acc = ep.Acceptor()  # hello
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    load_s = float(conf["probe_load_s"]) if name.startswith("probe") else 0.0
    try:
        time.sleep(load_s)
        loaded_at = time.time()
        with open(d / f"{name}.loaded", "a", encoding="ascii") as f:
            f.write(f"{loaded_at:.6f}\n")
        (d / f"{name}.ready").write_text(f"{os.getpid()}\n")
        if name != "probe_polled":
            acc.ready()
        ep.serve_http(GenerateHandler, acc)
    finally:
        for marker in (f"{name}.ready", f"{name}.pid"):
            if read_pid(d / marker) == os.getpid():
                (d / marker).unlink(missing_ok=True)
    return 0


def op(name: str) -> dict:
    d, svc = data_dir(), service()
    if name == "fingerprint":
        slots = int(settings()["slots"]) if svc == "bench" else 1
        return {"service_protocol": {"supported": [1]}, "health": "healthy",
                "pools": {svc: slots}, "reserve": {"mem_gb": 0.1}, "running": state()[0]}
    if name == "start":
        if state()[0]:
            return {"ok": True}
        from oarbank_sdk import service_endpoint as ep

        (d / f"{svc}.ready").unlink(missing_ok=True)
        with open(d / f"{svc}.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "serve"],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=HERE,
                                    **ep.inherit_channel())
        (d / f"{svc}.pid").write_text(f"{proc.pid}\n")
        return {"ok": True}
    if name == "stop":
        pid = read_pid(d / f"{svc}.pid")
        if alive(pid):
            assert pid is not None
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        for marker in (f"{svc}.ready", f"{svc}.pid"):
            (d / marker).unlink(missing_ok=True)
        return {"ok": True}
    if name in ("status", "ready"):
        running, ready = state()
        return {"running": running, "ready": ready}
    if name == "list_owned":
        return {"objects": []}
    if name == "destroy":
        return {"ok": True}
    raise KeyError(name)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        return serve()
    try:
        result = op(argv[0] if argv else "")
    except KeyError:
        print("usage: bench_service.py fingerprint|start|stop|status|ready|list_owned|destroy",
              file=sys.stderr)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
