"""A test endpoint service speaking the channel protocol directly, recording what it sees.

Every event goes to <module data>/events.jsonl as {"event", "t", "pid", ...}. Behaviour comes
from the node settings (OARBANK_SETTINGS_FILE): slots, reserve_gb (or reserve: the
fingerprint's whole ``reserve``), load_s, start_fail, never_ready,
no_hello, die_after_ready_s, die_once_after_ready_s (only the first daemon dies), die_after_ended
(the daemon exits once it has been told that many attempts ended), stop_hang (the
stop op never returns), ignore_term (the daemon ignores SIGTERM), linger_after_eof (it does not
exit when the agent closes its channel), detach (the daemon leaves the start op's process group:
a session of its own). A daemon exits at once (status 1) when the file
<module data>/die_now appears (it removes it first). garbage_after_ready (bytes the
daemon writes on its channel once ready). Without OARBANK_ENDPOINT_CHANNEL (a non-endpoint
service) the daemon just stays up until SIGTERM. Each op record lists the op's open
descriptors (``fds``: fd -> what it names). Standard library plus the SDK's wire helpers.
op_raise ({op: message}) makes that op die of an uncaught FileNotFoundError(message) after
writing op_stderr_kb KiB of noise to stderr. op_stdout_kb ({op: n}) makes that op print n KiB
of noise on stdout before its document. list_owned answers the objects in <module
data>/owned.json (a list; none without it); destroy <id> [--force] records the event and takes
the object out of that file. say_ready (n, default 0): the daemon says {"op": "ready"} on its
channel n times once loaded, where the agent offers the feature (OARBANK_ENDPOINT_FEATURES);
ready_before_hello: it says it once before its hello (a protocol violation).
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

from oarbank_sdk.protocol import current_transport, wire


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


def open_fds() -> dict[str, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own descriptor, closed by now
    return out


def op(name: str) -> int:
    conf = settings()
    record("op", op=name, env=sorted(os.environ), fds=open_fds(),
           features=os.environ.get("OARBANK_ENDPOINT_FEATURES"))
    if name in conf.get("op_raise", {}):
        # op_raise {op: message}: that op writes op_stderr_kb KiB of noise to stderr, then
        # dies of an uncaught FileNotFoundError(message) (a traceback, exit 1).
        noise = b"noise " * 170 + b"...\n"  # 1 KiB a line
        for _ in range(int(conf.get("op_stderr_kb", 0))):
            sys.stderr.buffer.write(noise)
        sys.stderr.flush()
        raise FileNotFoundError(conf["op_raise"][name])
    if name in conf.get("op_stdout_kb", {}):
        for _ in range(int(conf["op_stdout_kb"][name])):
            sys.stdout.write("noise " * 170 + "...\n")  # 1 KiB a line
    if name == "fingerprint":
        out = {"service_protocol": {"supported": [1]}, "health": conf.get("health", "healthy"),
               "pools": {"echo": conf.get("slots", 4)},
               "reserve": conf.get("reserve", {"mem_gb": conf.get("reserve_gb", 0.1)}),
               "running": alive(read_pid("daemon.pid"))}
    elif name == "start":
        if conf.get("start_fail"):
            print("start refused by settings", file=sys.stderr)
            return 1
        if alive(read_pid("daemon.pid")):
            out = {"ok": True}
        else:
            channel = os.environ.get("OARBANK_ENDPOINT_CHANNEL")
            fds = (current_transport().parse(channel),) if channel else ()
            with open(data() / "daemon.log", "ab") as log:
                p = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "serve"],
                                     stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     pass_fds=fds, start_new_session=bool(conf.get("detach")))
            (data() / "daemon.pid").write_text(str(p.pid))
            out = {"ok": True}
    elif name == "stop":
        if conf.get("stop_hang"):
            record("stop_hang")
            while True:
                time.sleep(3600)
        pid = read_pid("daemon.pid")
        if alive(pid):
            assert pid is not None
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        (data() / "daemon.pid").unlink(missing_ok=True)
        out = {"ok": True}
    elif name == "list_owned":
        try:
            out = {"objects": json.loads((data() / "owned.json").read_text())}
        except OSError:
            out = {"objects": []}
    elif name == "destroy":
        oid, force = sys.argv[2], "--force" in sys.argv[3:]
        record("destroy", id=oid, force=force)
        path = data() / "owned.json"
        if path.exists():
            left = [o for o in json.loads(path.read_text()) if o.get("id") != oid]
            path.write_text(json.dumps(left))
        out = {"ok": True}
    elif name in ("ready", "status"):
        pid = read_pid("daemon.pid")
        running = alive(pid)
        ready = running and read_pid("daemon.ready") == pid and not conf.get("never_ready")
        out = {"running": running, "ready": ready}
        record("answer", op=name, ready=ready)  # (its time: after the marker was read)
    else:
        print(f"unknown op {name}", file=sys.stderr)
        return 2
    print(json.dumps(out), flush=True)
    return 0


def die_on_file() -> None:
    """Tests kill the service at a moment of their choosing: <module data>/die_now."""
    path = data() / "die_now"
    while True:
        try:
            path.unlink()
        except FileNotFoundError:
            time.sleep(0.02)
            continue
        record("dying")
        os._exit(1)


def serve() -> int:
    conf = settings()
    tr = current_transport()
    if conf.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    record("daemon", fds=open_fds())
    threading.Thread(target=die_on_file, daemon=True).start()
    # ballast_mb: resident memory the daemon holds (pages really touched: a zero-filled
    # buffer would not be resident), so host protection sees a large footprint.
    ballast = b"\x01" * (int(conf.get("ballast_mb", 0)) << 20)  # noqa: F841
    if "OARBANK_ENDPOINT_CHANNEL" not in os.environ:
        (data() / "daemon.ready").write_text(str(os.getpid()))
        record("ready")
        if conf.get("die_after_ready_s") is not None:
            threading.Timer(float(conf["die_after_ready_s"]), lambda: os._exit(1)).start()
        while True:
            time.sleep(3600)
    ch = tr.open_stream(tr.parse(os.environ["OARBANK_ENDPOINT_CHANNEL"]))
    offered = "ready" in os.environ.get("OARBANK_ENDPOINT_FEATURES", "").split(",")
    if conf.get("ready_before_hello"):
        ch.sendall(wire.encode(wire.Ready().to_wire()))
    if not conf.get("no_hello"):
        ch.sendall(wire.encode(wire.Hello(os.getpid()).to_wire()))
        record("hello")
    time.sleep(float(conf.get("load_s", 0)))
    with open(data() / "loads", "a") as f:
        f.write(f"{os.getpid()}\n")
    record("ready")  # before the marker: an op that reads the marker answers after this
    (data() / "daemon.ready").write_text(str(os.getpid()))
    for _ in range(int(conf.get("say_ready", 0)) if offered else 0):
        record("said_ready")
        ch.sendall(wire.encode(wire.Ready().to_wire()))
    if conf.get("die_after_ready_s") is not None:
        threading.Timer(float(conf["die_after_ready_s"]), lambda: os._exit(1)).start()
    once = data() / "died_once"
    if conf.get("die_once_after_ready_s") is not None and not once.exists():
        once.write_text(str(os.getpid()))
        threading.Timer(float(conf["die_once_after_ready_s"]), lambda: os._exit(1)).start()
    if conf.get("garbage_after_ready"):
        ch.sendall(str(conf["garbage_after_ready"]).encode())
    conns: dict[str, list[socket.socket]] = {}
    lock = threading.Lock()
    splitter = wire.LineSplitter()
    ended = 0
    while True:
        chunk, fds = tr.recv(ch, 65536)
        if not chunk:
            record("channel_eof")
            while conf.get("linger_after_eof"):  # a daemon that does not take the hint
                time.sleep(3600)
            return 0
        for line in splitter.feed(chunk):
            msg = wire.parse_to_service(wire.decode(line))
            if isinstance(msg, wire.Connection):
                sock = socket.socket(fileno=fds.pop(0))
                ch.sendall(wire.encode(wire.Accepted(msg.conn).to_wire()))
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
                ended += 1
                if conf.get("die_after_ended") is not None and ended >= int(conf["die_after_ended"]):
                    os._exit(1)


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
