"""The harness's helper inside a VM node: root, under systemd, standard library only.

It is copied into the node's disk image (`/usr/local/lib/oarbank-harness/guest.py`) and talks
to the harness over two virtio serial ports, found by name under /sys/class/virtio-ports:

- `oarbank.control`: JSON lines. The helper's first line is `{"hello": {...}}` (the kernel,
  the Landlock ABI): the harness waits for it to know the node is up. Then requests
  `{"id", "op", ...}`, each handled in a thread of its own (the harness submits jobs in
  parallel), answered `{"id", "ok": true, ...}` or `{"id", "ok": false, "error"}`.
- `oarbank.portal`: frames (`encode`, `Decoder`) carrying the connections the agent makes to
  /run/oarbank-harness/portal.sock here to the portal's unix socket on the host. The guest has
  no network device: this is the node's only way out, and only to the portal.

The frame codec and `Mux` are shared with the host side (harness.nodes.vm.channel imports them).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import json
import os
import pwd
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

CONTROL_PORT = "oarbank.control"
PORTAL_PORT = "oarbank.portal"
PORTAL_SOCKET = "/run/oarbank-harness/portal.sock"
MAX_FILE = 8 << 20  # what `read`/`find` hand back per file

# --- frames: one connection's bytes on the shared portal port -------------------------------

OPEN, DATA, EOF, CLOSE = 1, 2, 3, 4
_HEADER = struct.Struct("!IBI")  # connection id, kind, payload length
MAX_PAYLOAD = 1 << 16


def encode(conn: int, kind: int, payload: bytes = b"") -> bytes:
    if kind not in (OPEN, DATA, EOF, CLOSE):
        raise ValueError(f"unknown frame kind {kind}")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(payload)} bytes (at most {MAX_PAYLOAD})")
    return _HEADER.pack(conn, kind, len(payload)) + payload


class Decoder:
    """Bytes in (any split), whole frames `(conn, kind, payload)` out."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self._buf += data
        out = []
        while len(self._buf) >= _HEADER.size:
            conn, kind, n = _HEADER.unpack_from(self._buf)
            if kind not in (OPEN, DATA, EOF, CLOSE) or n > MAX_PAYLOAD:
                raise ValueError(f"bad frame header: conn {conn} kind {kind} length {n}")
            if len(self._buf) < _HEADER.size + n:
                break
            out.append((conn, kind, bytes(self._buf[_HEADER.size:_HEADER.size + n])))
            del self._buf[:_HEADER.size + n]
        return out


class Mux:
    """Unix socket connections multiplexed over one byte stream (`read`, `write`). The side
    that accepts a connection calls `add` (sends OPEN); the other side gets OPEN and makes
    its own connection with `connect` (None: no peer side opens connections)."""

    def __init__(self, read: Callable[[int], bytes], write: Callable[[bytes], None],
                 connect: Callable[[], socket.socket] | None = None) -> None:
        self._read, self._write, self._connect = read, write, connect
        self._wlock = threading.Lock()
        self._conns: dict[int, socket.socket] = {}
        self._eof: dict[int, set[str]] = {}  # which directions have ended
        self._lock = threading.Lock()
        self._next = 1
        self.closed = threading.Event()

    def send(self, conn: int, kind: int, payload: bytes = b"") -> None:
        with self._wlock:
            self._write(encode(conn, kind, payload))

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            conn = self._next
            self._next += 1
            self._conns[conn] = sock
            self._eof[conn] = set()
        self.send(conn, OPEN)
        threading.Thread(target=self._pump, args=(conn, sock), daemon=True).start()

    def _pump(self, conn: int, sock: socket.socket) -> None:
        """This side's socket -> frames, until its EOF (or an error: CLOSE)."""
        try:
            while True:
                data = sock.recv(MAX_PAYLOAD)
                if not data:
                    self.send(conn, EOF)
                    self._ended(conn, "out")
                    return
                self.send(conn, DATA, data)
        except OSError:
            with contextlib.suppress(OSError):
                self.send(conn, CLOSE)
            self._drop(conn)

    def _ended(self, conn: int, direction: str) -> None:
        with self._lock:
            seen = self._eof.get(conn)
            if seen is None:
                return
            seen.add(direction)
            done = len(seen) == 2
        if done:
            self._drop(conn)

    def _drop(self, conn: int) -> None:
        with self._lock:
            sock = self._conns.pop(conn, None)
            self._eof.pop(conn, None)
        if sock is not None:
            with contextlib.suppress(OSError):  # wakes a pump blocked in recv
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def run(self) -> None:
        """Frames from the stream -> the connections, until the stream ends."""
        dec = Decoder()
        try:
            while True:
                data = self._read(MAX_PAYLOAD)
                if not data:
                    return
                for conn, kind, payload in dec.feed(data):
                    self._frame(conn, kind, payload)
        finally:
            self.closed.set()
            for conn in list(self._conns):
                self._drop(conn)

    def _frame(self, conn: int, kind: int, payload: bytes) -> None:
        if kind == OPEN:
            if self._connect is None:
                self.send(conn, CLOSE)
                return
            try:
                sock = self._connect()
            except OSError:
                self.send(conn, CLOSE)
                return
            with self._lock:
                self._conns[conn] = sock
                self._eof[conn] = set()
            threading.Thread(target=self._pump, args=(conn, sock), daemon=True).start()
            return
        peer = self._conns.get(conn)
        if peer is None:
            return
        try:
            if kind == DATA:
                peer.sendall(payload)
            elif kind == EOF:
                peer.shutdown(socket.SHUT_WR)
                self._ended(conn, "in")
            else:
                self._drop(conn)
        except OSError:
            with contextlib.suppress(OSError):
                self.send(conn, CLOSE)
            self._drop(conn)


# --- the guest side -------------------------------------------------------------------------


def find_port(name: str, wait_s: float = 120.0) -> str:
    """/dev/<vportNpM> of the virtio serial port called `name`."""
    deadline = time.monotonic() + wait_s
    with contextlib.suppress(OSError):
        subprocess.run(["modprobe", "virtio_console"], capture_output=True, timeout=30)
    while True:
        with contextlib.suppress(OSError):
            for dev in os.listdir("/sys/class/virtio-ports"):
                with open(f"/sys/class/virtio-ports/{dev}/name") as f:
                    if f.read().strip() == name and os.path.exists(f"/dev/{dev}"):
                        return f"/dev/{dev}"
        if time.monotonic() > deadline:
            raise SystemExit(f"no virtio serial port named {name}")
        time.sleep(0.2)


class Port:
    """A virtio serial port opened for reading and writing. A read gives b"" while the host
    side is not connected: waited out here, so b"" is never returned."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR)

    def read(self, n: int) -> bytes:
        while True:
            data = os.read(self.fd, n)
            if data:
                return data
            time.sleep(0.2)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]


def landlock_abi() -> int:
    """The kernel's Landlock ABI (0: none), as the sandbox asks for it."""
    libc = ctypes.CDLL(None, use_errno=True)
    nr = 444  # landlock_create_ruleset, the same number on every architecture
    abi = libc.syscall(nr, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(abi), 0)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def op_exec(req: dict[str, Any]) -> dict[str, Any]:
    timeout = float(req.get("timeout_s", 120))
    p = subprocess.Popen(req["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, 9)
        out, err = p.communicate()
        rc = 124
        err += f"\n(timed out after {timeout:g} s)".encode()
    return {"rc": rc, "stdout": out.decode(errors="replace"),
            "stderr": err.decode(errors="replace")}


def op_write(req: dict[str, Any]) -> dict[str, Any]:
    path = req["path"]
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_APPEND if req.get(
        "append") else 0), int(req.get("mode", 0o644)))
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(req["data"]))
    os.chmod(path, int(req.get("mode", 0o644)))
    if req.get("owner"):
        pw = pwd.getpwnam(req["owner"])
        os.chown(path, pw.pw_uid, pw.pw_gid)
    return {}


def op_read(req: dict[str, Any]) -> dict[str, Any]:
    try:
        with open(req["path"], "rb") as f:
            size = os.fstat(f.fileno()).st_size
            tail = int(req.get("tail", MAX_FILE))
            f.seek(max(0, size - min(tail, MAX_FILE)))
            return {"data": _b64(f.read())}
    except FileNotFoundError:
        return {"data": None}


def op_find(req: dict[str, Any]) -> dict[str, Any]:
    """Every file called `name` under `root`: (path relative to root, contents)."""
    root, name = req["root"], req["name"]
    files = []
    for here, _dirs, names in os.walk(root):
        if name in names:
            path = os.path.join(here, name)
            with contextlib.suppress(OSError), open(path, "rb") as f:
                files.append({"rel": os.path.relpath(path, root), "data": _b64(f.read(MAX_FILE))})
    return {"files": files}


def _proc_table() -> dict[int, dict[str, Any]]:
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            fields = stat[stat.rindex(")") + 2:].split()
            with open(f"/proc/{pid}/status") as f:
                uid = next(int(ln.split()[1]) for ln in f if ln.startswith("Uid:"))
            with open(f"/proc/{pid}/cgroup") as f:
                cgroup = f.read().strip().rsplit(":", 1)[-1]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, StopIteration, ValueError):
            continue
        table[pid] = {"pid": pid, "state": fields[0], "ppid": int(fields[1]),
                      "pgid": int(fields[2]), "uid": uid, "cgroup": cgroup,
                      "cmdline": cmd or stat[stat.index("(") + 1:stat.rindex(")")]}
    return table


def op_procs(req: dict[str, Any]) -> dict[str, Any]:
    """The node's processes: those of `user` or in the cgroup subtree `cgroup`, zombies and
    what this helper runs itself (the harness's own commands) left out."""
    uid = pwd.getpwnam(req["user"]).pw_uid
    prefix = req["cgroup"]
    table = _proc_table()
    mine = {os.getpid()}
    grew = True
    while grew:  # descendants of the helper
        grew = False
        for p in table.values():
            if p["ppid"] in mine and p["pid"] not in mine:
                mine.add(p["pid"])
                grew = True
    found = [p for p in table.values()
             if p["pid"] not in mine and p["state"] != "Z"
             and (p["uid"] == uid or p["cgroup"] == prefix
                  or p["cgroup"].startswith(prefix + "/"))]
    return {"procs": [{k: p[k] for k in ("pid", "pgid", "cmdline")} for p in found]}


OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ping": lambda req: {},
    "exec": op_exec,
    "write": op_write,
    "read": op_read,
    "find": op_find,
    "procs": op_procs,
}


def serve_control(port: Port) -> None:
    wlock = threading.Lock()

    def answer(msg: dict[str, Any]) -> None:
        line = (json.dumps(msg) + "\n").encode()
        with wlock:
            port.write(line)

    def handle(req: dict[str, Any]) -> None:
        try:
            out = OPS[req["op"]](req)
            answer({"id": req.get("id"), "ok": True, **out})
        except Exception as exc:  # answered, never fatal: the harness shows it
            answer({"id": req.get("id"), "ok": False, "error": f"{type(exc).__name__}: {exc}"})

    answer({"hello": {"kernel": os.uname().release, "landlock_abi": landlock_abi(),
                      "pid": os.getpid()}})
    buf = b""
    while True:
        buf += port.read(MAX_PAYLOAD)
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                req = json.loads(line)
                threading.Thread(target=handle, args=(req,), daemon=True).start()


def serve_portal(port: Port) -> None:
    os.makedirs(os.path.dirname(PORTAL_SOCKET), mode=0o755, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(PORTAL_SOCKET)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(PORTAL_SOCKET)
    os.chmod(PORTAL_SOCKET, 0o666)  # the agent's user connects
    listener.listen(64)
    mux = Mux(port.read, port.write)
    threading.Thread(target=mux.run, daemon=True).start()
    while True:
        conn, _ = listener.accept()
        mux.add(conn)


def main() -> int:
    portal = Port(find_port(PORTAL_PORT))
    threading.Thread(target=serve_portal, args=(portal,), daemon=True).start()
    serve_control(Port(find_port(CONTROL_PORT)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
