"""A test endpoint service speaking the channel protocol directly, recording what it sees.

Every event goes to <module data>/events.jsonl as {"event", "t", "pid", ...}. Behaviour comes
from the node settings (OARBANK_SETTINGS_FILE): slots, load_s, start_fail, never_ready,
no_hello, die_after_ready_s. Standard library plus the SDK's wire helpers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from oarbank_sdk import _wire
from oarbank_sdk._transport import current


def data() -> Path:
    return Path(os.environ["OARBANK_MODULE_DATA"])


def settings() -> dict:
    try:
        return json.loads(Path(os.environ["OARBANK_SETTINGS_FILE"]).read_text())
    except (KeyError, OSError, ValueError):
        return {}


def record(event: str, **kw: object) -> None:
    line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **kw}) + "\n"
    fd = os.open(data() / "events.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read_pid(name: str) -> int | None:
    try:
        text = (data() / name).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def op(name: str) -> int:
    conf = settings()
    record("op", op=name, env=sorted(os.environ))
    if name == "fingerprint":
        out = {"service_protocol": {"supported": [1]}, "health": "healthy",
               "pools": {"echo": conf.get("slots", 4)}, "reserve": {"mem_gb": 0.1},
               "running": alive(read_pid("daemon.pid"))}
    elif name == "start":
        if conf.get("start_fail"):
            print("start refused by settings", file=sys.stderr)
            return 1
        if alive(read_pid("daemon.pid")):
            out = {"ok": True}
        else:
            fd = current().parse(os.environ["OARBANK_ENDPOINT_CHANNEL"])
            with open(data() / "daemon.log", "ab") as log:
                p = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "serve"],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     pass_fds=(fd,))
            (data() / "daemon.pid").write_text(str(p.pid))
            out = {"ok": True}
    elif name == "stop":
        pid = read_pid("daemon.pid")
        if alive(pid):
            assert pid is not None
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        (data() / "daemon.pid").unlink(missing_ok=True)
        out = {"ok": True}
    elif name in ("ready", "status"):
        pid = read_pid("daemon.pid")
        running = alive(pid)
        ready = running and read_pid("daemon.ready") == pid and not conf.get("never_ready")
        out = {"running": running, "ready": ready}
    else:
        print(f"unknown op {name}", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


def serve() -> int:
    conf = settings()
    tr = current()
    ch = tr.open_stream(tr.parse(os.environ["OARBANK_ENDPOINT_CHANNEL"]))
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if not conf.get("no_hello"):
        ch.sendall(_wire.encode(_wire.Hello(os.getpid()).to_wire()))
        record("hello")
    time.sleep(float(conf.get("load_s", 0)))
    with open(data() / "loads", "a") as f:
        f.write(f"{os.getpid()}\n")
    (data() / "daemon.ready").write_text(str(os.getpid()))
    record("ready")
    if conf.get("die_after_ready_s") is not None:
        threading.Timer(float(conf["die_after_ready_s"]), lambda: os._exit(1)).start()
    conns: dict[str, list[socket.socket]] = {}
    lock = threading.Lock()
    splitter = _wire.LineSplitter()
    while True:
        chunk, fds = tr.recv(ch, 65536)
        if not chunk:
            record("channel_eof")
            return 0
        for line in splitter.feed(chunk):
            msg = _wire.parse_to_service(_wire.decode(line))
            if isinstance(msg, _wire.Connection):
                sock = socket.socket(fileno=fds.pop(0))
                ch.sendall(_wire.encode(_wire.Accepted(msg.conn).to_wire()))
                with lock:
                    conns.setdefault(msg.attempt, []).append(sock)
                record("connection", attempt=msg.attempt, conn=msg.conn)
                threading.Thread(target=echo, args=(sock,), daemon=True).start()
            else:
                with lock:
                    mine = conns.pop(msg.attempt, [])
                still_open = sum(1 for s in mine if s.fileno() >= 0)
                for s in mine:
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    s.close()
                record("ended", attempt=msg.attempt, connections=len(mine),
                       open_before=still_open, open_after=sum(1 for s in mine if s.fileno() >= 0))


def echo(sock: socket.socket) -> None:
    buf = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                sock.sendall(f"{os.getpid()} ".encode() + line + b"\n")
    except OSError:
        pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        sys.exit(serve())
    sys.exit(op(sys.argv[1]))
