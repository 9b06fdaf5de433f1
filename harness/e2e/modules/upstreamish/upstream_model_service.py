"""The example's model service with its daemon's side of the channel written as upstream's SDK
writes it: on the raw channel, ``int(msg["attempt"])`` on every ``connection`` and ``ended``.

Upstream's ``Acceptor.accept()`` turns the attempt id into an ``int``; a string id (what our
agent sent before contract section 3 said integers) raises ``ValueError`` there and the daemon
dies. This daemon does the same, so a run that passes proves our agent and our conformance
kit send integer ids. Nothing here uses ``oarbank_sdk``: only ``start`` and ``serve`` are
this file's; the other ops, the settings, the stand-in model and the HTTP handler are the
example's own (``model_service.py`` next to this file, from harness-base.txt).

The daemon runs as this file (``... upstream_model_service.py serve``): its name contains
``model_service.py`` on purpose, the scenarios find the service's daemon by that name. The ops
run through ``ops.py`` (the manifest's exec), so they are not taken for it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("model_service", HERE / "model_service.py")
assert _spec is not None and _spec.loader is not None
ms = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ms)


def serve() -> int:
    """hello, load, then serve each handed connection; exit on EOF (the agent stops us)."""
    d, conf = ms.data_dir(), ms.settings()
    chan = socket.socket(fileno=int(os.environ["OARBANK_ENDPOINT_CHANNEL"].split(":", 1)[1]))
    send = threading.Lock()

    def say(msg: dict) -> None:
        with send:
            chan.sendall(json.dumps(msg).encode() + b"\n")

    say({"op": "hello", "pid": os.getpid()})
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    ms.load_model(d, float(conf["load_s"]))
    (d / ms.READY_FILE).write_text(f"{os.getpid()}\n")
    ms.Handler.data = d
    server = types.SimpleNamespace(server_name="endpoint", server_port=0)
    open_conns: dict[int, list[socket.socket]] = {}
    buf, fds = b"", []
    while True:
        data, got, _flags, _addr = socket.recv_fds(chan, 65536, 16)
        if not data:
            return 0
        buf, fds = buf + data, fds + got
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            msg = json.loads(line)
            attempt = int(msg["attempt"])  # upstream: a str id raises here and the daemon dies
            if msg["op"] == "ended":
                for c in open_conns.pop(attempt, []):
                    with contextlib.suppress(OSError):
                        c.shutdown(socket.SHUT_RDWR)  # wakes its handler; then it is gone
                    c.close()
                continue
            conn = socket.socket(fileno=fds.pop(0))
            say({"op": "accepted", "conn": msg["conn"]})
            open_conns.setdefault(attempt, []).append(conn)
            threading.Thread(target=ms.Handler, args=(conn, ("endpoint", attempt), server),
                             daemon=True).start()


def op_start() -> dict:
    d = ms.data_dir()
    ms.settings()
    if ms.daemon_state(d)[0]:
        return {"ok": True}
    fd = int(os.environ["OARBANK_ENDPOINT_CHANNEL"].split(":", 1)[1])
    (d / ms.READY_FILE).unlink(missing_ok=True)
    with open(d / "model.log", "ab") as log:  # its own log (the example inherits stderr)
        proc = subprocess.Popen([sys.executable, "-I", __file__, "serve"], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, cwd=HERE, pass_fds=(fd,))
    (d / ms.PID_FILE).write_text(f"{proc.pid}\n")
    return {"ok": True}


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        sys.exit(serve())
    ms.OPS["start"] = op_start
    sys.exit(ms.main(sys.argv[1:]))
