"""A service that tries to listen, as a naive HTTP server would, and carries on serving.

`start` leaves the daemon running with the endpoint channel. The daemon says hello, then tries
`listen()` on 127.0.0.1 (TCP) and on a unix socket path in its data dir, appending one JSON
line per try to `<module data>/listen.attempts`: {"kind", "ok", "error", "pid"}. Whatever
happened it then serves through the channel, like a server that treats its own listener as
optional: refused (the sandbox) it says nothing about it; granted (no sandbox) it keeps the
listeners open (where this Python has no AF_UNIX, Windows', the unix try records that
error). Its hello, `ready` and requests all pass, so only a check that sees the
attempt itself (conform's network attempts, never listens) can fail it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from oarbank_sdk import service_endpoint as ep


def data() -> Path:
    d = Path(os.environ.get("OARBANK_MODULE_DATA", "."))
    d.mkdir(parents=True, exist_ok=True)
    return d


def try_listen(kind: str) -> tuple[socket.socket | None, dict]:
    try:
        if kind == "tcp":
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
        else:
            path = str(data() / "web.sock")
            if os.path.exists(path):
                os.unlink(path)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(path)
        s.listen(8)
        return s, {"kind": kind, "ok": True, "error": None}
    except (OSError, AttributeError) as exc:  # AttributeError: no AF_UNIX (Windows' Python)
        return None, {"kind": kind, "ok": False, "error": f"{type(exc).__name__}: {exc}"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serve() -> int:
    acc = ep.Acceptor()  # the hello: the channel is up before anything else
    held = []  # granted listeners stay open (and visible) while it serves
    with open(data() / "listen.attempts", "a", encoding="utf-8") as f:
        for kind in ("tcp", "unix"):
            s, rec = try_listen(kind)
            rec["pid"] = os.getpid()
            f.write(json.dumps(rec) + "\n")
            if s is not None:
                held.append(s)
    (data() / "web.ready").write_text(str(os.getpid()))
    ep.serve_http(Handler, acc)
    return 0


def daemon_pid() -> int | None:
    try:
        return int((data() / "web.ready").read_text())
    except (OSError, ValueError):
        return None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    if os.name == "nt":
        return _alive_on_windows(pid)  # os.kill(pid, 0) there would end the process
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _alive_on_windows(pid: int) -> bool:
    """A handle that can wait on ``pid``, and the wait not yet over: it runs."""
    import ctypes

    kernel32 = ctypes.WinDLL("kernel32")  # type: ignore[attr-defined,unused-ignore]  # Windows only
    synchronize, wait_timeout = 0x00100000, 0x102
    handle = kernel32.OpenProcess(synchronize, False, pid)
    if not handle:
        return False
    try:
        return bool(kernel32.WaitForSingleObject(handle, 0) == wait_timeout)
    finally:
        kernel32.CloseHandle(handle)


def main(argv: list[str]) -> int:
    if argv[:2] == ["runner", "doctor"]:  # the runner's health, in the contract's form
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": []}))
        return 0
    op = argv[-1] if argv else ""
    if op == "serve":
        return serve()
    if op == "fingerprint":
        print(json.dumps({"service_protocol": {"supported": [1]}, "health": "healthy",
                          "pools": {"web": 1}, "reserve": {"mem_gb": 0},
                          "running": alive(daemon_pid())}))
        return 0
    if op == "start":
        with contextlib.suppress(OSError):
            (data() / "web.ready").unlink()
        with open(data() / "web.log", "ab") as log:
            subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "serve"],
                             stdout=log, stderr=log, **ep.inherit_channel())
        time.sleep(0.2)
        print(json.dumps({"ok": True}))
        return 0
    if op in ("status", "ready"):
        up = alive(daemon_pid())
        print(json.dumps({"running": up, "ready": up}))
        return 0
    if op in ("stop", "destroy"):
        print(json.dumps({"ok": True}))
        return 0
    if op == "list_owned":
        print(json.dumps({"objects": []}))
        return 0
    print("listener: the fetch stage has no runner logic", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
