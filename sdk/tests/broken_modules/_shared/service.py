"""One tiny endpoint service for every broken test module: MODE picks what is wrong with it.

    python -I service.py MODE <op>        (the agent's ops)
    python -I service.py MODE serve       (the daemon `start` leaves running)

MODE: ok, listen_tcp, listen_unix, no_hello, never_ready, answer_500, quiet_listen (tries
socket/bind/listen/connect, swallows every refusal, logs nothing and serves perfectly),
fp_pools (fingerprint answers a pool the manifest does not provide), fp_protocol (fingerprint
lists service protocol 2 only), ready_no_hello (ready says true, no hello ever), no_inherit
(`start` does not pass the channel on: the daemon's Acceptor() fails and it exits),
said_ready_op_false (says ready on the channel, but its `ready` op never answers true).
HTTP: POST /echo {"prompt": s} -> 200 {"text": s.upper()} (500 for everything in answer_500).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

from oarbank_sdk import service_endpoint as ep

MODES = ("ok", "listen_tcp", "listen_unix", "no_hello", "never_ready", "answer_500",
         "quiet_listen", "fp_pools", "fp_protocol", "ready_no_hello", "no_inherit",
         "said_ready_op_false")
DATA = Path(os.environ.get("OARBANK_MODULE_DATA", "."))
PID, READY, LOG = DATA / "service.pid", DATA / "service.ready", DATA / "service.log"


def alive(path: Path) -> bool:
    try:
        pid = int(path.read_text())
    except (OSError, ValueError):
        return False
    if os.name == "nt":  # os.kill(pid, 0) there would end the process
        import ctypes

        kernel32 = ctypes.WinDLL("kernel32")  # type: ignore[attr-defined]  (Windows only)
        handle = kernel32.OpenProcess(0x00100000, False, pid)  # SYNCHRONIZE
        if not handle:
            return False
        try:
            return bool(kernel32.WaitForSingleObject(handle, 0) == 0x102)  # WAIT_TIMEOUT
        finally:
            kernel32.CloseHandle(handle)
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "ok"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        status, answer = 404, {"error": "not found"}
        if self.mode == "answer_500":
            status, answer = 500, {"error": "broken on purpose"}
        elif self.path == "/echo":
            status, answer = 200, {"text": json.loads(body)["prompt"].upper()}
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


def serve(mode: str) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if mode in ("no_hello", "ready_no_hello"):
        if mode == "ready_no_hello":
            READY.write_text("1")  # `ready` says true although no hello came
        while True:  # holds the channel, never says hello
            time.sleep(1)
    acc = ep.Acceptor()
    held = []
    if mode == "listen_tcp":  # the sandbox refuses this (PermissionError): the daemon dies
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen()
        held.append(s)
    elif mode == "listen_unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(DATA / "service.sock"))
        s.listen()
        held.append(s)
    elif mode == "quiet_listen":  # tries, and hides it: nothing logged, serves as if all was well
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            s.listen()
            held.append(s)
        except OSError:
            pass
        mine, _theirs = socket.socketpair()  # a socket it holds: bind/listen/connect on it
        held.extend((mine, _theirs))
        for call in (lambda: mine.listen(), lambda: mine.bind(b"\0quiet"),
                     lambda: mine.connect(b"\0elsewhere")):
            try:
                call()
            except OSError:
                pass
    if mode not in ("never_ready", "said_ready_op_false"):
        READY.write_text("1")
    if mode == "said_ready_op_false":
        acc.ready()
    Handler.mode = mode
    ep.serve_http(Handler, acc)


def main(mode: str, op: str) -> int:
    if op == "serve":
        serve(mode)
        return 0
    if op == "start":
        if not alive(PID):
            with open(LOG, "ab") as log:
                passed = {} if mode == "no_inherit" else ep.inherit_channel()
                proc = subprocess.Popen([sys.executable, "-I", __file__, mode, "serve"],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        **passed)
            PID.write_text(str(proc.pid))
        result: dict = {"ok": True}
    elif op == "stop":
        if alive(PID):
            os.kill(int(PID.read_text()), signal.SIGTERM)
        result = {"ok": True}
    elif op in ("status", "ready"):
        result = {"running": alive(PID), "ready": alive(PID) and READY.exists()}
    elif op == "fingerprint":
        result = {"service_protocol": {"supported": [2 if mode == "fp_protocol" else 1]},
                  "health": "healthy", "pools": {"model" if mode == "fp_pools" else "echo": 2},
                  "reserve": {"mem_gb": 0.1}, "running": alive(PID)}
    else:
        result = {"objects": []} if op == "list_owned" else {"ok": True}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in MODES:
        sys.exit(f"usage: service.py {{{','.join(MODES)}}} OP")
    sys.exit(main(sys.argv[1], sys.argv[2]))
