"""A service and a runner that try the network quietly: every refusal swallowed, nothing logged.

    python -I quiet_trier.py <op>          service ops (start leaves the daemon: `serve`)
    python -I quiet_trier.py run --spec S --workdir W --out O      the runner

The daemon says hello, tries socket(AF_INET) + bind + listen and listen() on a socketpair end
it holds, then serves HTTP through its channel (200 for anything); with the setting
``give_up`` it exits 3 instead (a server that cannot bind). The runner tries
socket(AF_INET6) and connect() on a socketpair end, then succeeds with an empty payload.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from oarbank_sdk import service_endpoint as ep


def data() -> Path:
    return Path(os.environ["OARBANK_MODULE_DATA"])


def settings() -> dict:
    try:
        return json.loads(Path(os.environ["OARBANK_SETTINGS_FILE"]).read_text())
    except (KeyError, OSError, ValueError):
        return {}


def quietly(*calls) -> None:
    for call in calls:
        try:
            call()
        except OSError:
            pass


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def serve() -> int:
    acc = ep.Acceptor()
    mine, theirs = socket.socketpair()

    def tcp() -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen()

    quietly(tcp, lambda: mine.listen())
    if settings().get("give_up"):
        return 3
    (data() / "up").write_text(str(os.getpid()))
    ep.serve_http(Handler, acc)
    return 0


def runner(args: list[str]) -> int:
    opts = dict(zip(args[::2], args[1::2], strict=False))
    a, b = socket.socketpair()
    quietly(lambda: socket.socket(socket.AF_INET6), lambda: a.connect(b"\0elsewhere"))
    Path(opts["--out"]).write_text(json.dumps({"envelope": 1, "payload": {}}))
    return 0


def alive() -> bool:
    try:
        os.kill(int((data() / "up").read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"]:
        return runner(argv[1:])
    op = argv[-1] if argv else ""
    if op == "serve":
        return serve()
    if op == "start":
        subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "serve"],
                         stdin=subprocess.DEVNULL, **ep.inherit_channel())
        print(json.dumps({"ok": True}))
    elif op in ("ready", "status"):
        print(json.dumps({"running": alive(), "ready": alive()}))
    elif op == "fingerprint":
        print(json.dumps({"service_protocol": {"supported": [1]}, "health": "healthy",
                          "pools": {"echo": 1}, "reserve": {"mem_gb": 0}, "running": alive()}))
    else:
        print(json.dumps({"ok": True}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
