"""The probe child ``capabilities()`` runs inside the launcher: it tries each refused
operation for real, harmlessly, and prints what happened as one JSON line.

Each outcome is "ok" (the operation worked) or the errno number it failed with. Operations on
"held" sockets use a socketpair end, where the unconfined kernel answers something other than
EPERM (EINVAL, EISCONN, ...), so an EPERM can only come from the filter.

argv[1]: the caller's network namespace (readlink of /proc/self/ns/net), to tell whether
this child got a fresh one.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys

__all__ = ["run"]

_IO_URING_SETUP = 425  # same number on every architecture (new syscall table)


def _try(fn) -> object:
    try:
        result = fn()
    except OSError as exc:
        return exc.errno
    if isinstance(result, socket.socket):
        result.close()
    return "ok"


def _socket(family: int, kind: int = socket.SOCK_STREAM, proto: int = 0):
    return lambda: socket.socket(family, kind, proto)


def _io_uring_setup() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    # NULL params: EFAULT unfiltered, so nothing is ever created.
    fd = libc.syscall(ctypes.c_long(_IO_URING_SETUP), ctypes.c_uint(1), ctypes.c_void_p(None))
    if fd >= 0:
        os.close(fd)
        return
    err = ctypes.get_errno()
    raise OSError(err, os.strerror(err))


def run(parent_netns: str) -> dict:
    ops: dict[str, object] = {}
    ops["socket_inet"] = _try(_socket(socket.AF_INET))
    ops["socket_inet6"] = _try(_socket(socket.AF_INET6))
    ops["socket_unix"] = _try(_socket(socket.AF_UNIX))
    if hasattr(socket, "AF_PACKET"):
        ops["socket_packet"] = _try(_socket(socket.AF_PACKET, socket.SOCK_RAW))
    if hasattr(socket, "AF_NETLINK"):
        ops["socket_netlink"] = _try(_socket(socket.AF_NETLINK, socket.SOCK_RAW))
    try:
        a, b = socket.socketpair()
    except OSError as exc:
        ops["socketpair"] = exc.errno
    else:
        with a, b:
            a.sendall(b"x")
            ops["socketpair"] = "ok" if b.recv(1) == b"x" else "broken"
            ops["listen_held"] = _try(lambda: a.listen(1))
            ops["accept_held"] = _try(lambda: a.accept())
            ops["bind_held"] = _try(lambda: a.bind("\0oarbank-probe"))
            ops["connect_held"] = _try(lambda: a.connect("\0oarbank-probe"))
    ops["io_uring_setup"] = _try(_io_uring_setup)
    if sys.platform == "darwin":  # what Seatbelt decides on: names and loopback

        def bind_inet() -> None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))

        def connect_inet() -> None:
            with socket.socket() as s:
                s.settimeout(1)
                s.connect(("127.0.0.1", 9))

        def listen_unix() -> None:
            with socket.socket(socket.AF_UNIX) as s:
                s.listen(1)

        ops["bind_inet"] = _try(bind_inet)
        ops["connect_inet"] = _try(connect_inet)
        ops["listen_unix"] = _try(listen_unix)
    status: dict[str, str] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("NoNewPrivs", "Seccomp"):
                    status[key] = value.strip()
    except OSError:
        pass
    try:
        own_netns = bool(parent_netns) and os.readlink("/proc/self/ns/net") != parent_netns
    except OSError:
        own_netns = False
    return {"ops": ops, "status": status, "own_netns": own_netns}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1] if len(sys.argv) > 1 else "")))
