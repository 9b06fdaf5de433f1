"""The probe child ``capabilities()`` runs inside the launcher: it tries each refused
operation for real, harmlessly, and prints what happened as one JSON line.

Each outcome is "ok" (the operation worked) or the errno number it failed with. Operations on
"held" sockets use a socketpair end, where the unconfined kernel answers something other than
EPERM (EINVAL, EISCONN, ...), so an EPERM can only come from the filter.

argv[1]: the caller's network namespace (readlink of /proc/self/ns/net), to tell whether
this child got a fresh one. argv[2:5] (optional): a folder the launcher was told to make
writable, a folder it was not (both empty, made by the caller), and the caller's pid (a
process outside this sandbox, of the same user: signal 0 to it must be refused by the scope).

The process and privilege probes use calls whose unfiltered answer is never EPERM (an invalid
request, a no-op, a NULL pointer), so EPERM can only be the filter's and nothing is created.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import sys

__all__ = ["run"]

_IO_URING_SETUP = 425  # same number on every architecture (new syscall table)
_CLONE3 = 435
_LANDLOCK_CREATE_RULESET = 444
# Per-architecture numbers of the older calls.
_NR = {
    "x86_64": {"ptrace": 101, "process_vm_readv": 310, "kcmp": 312, "unshare": 272,
               "clone": 56, "bpf": 321, "keyctl": 250, "perf_event_open": 298,
               "userfaultfd": 323},
    "aarch64": {"ptrace": 117, "process_vm_readv": 270, "kcmp": 272, "unshare": 97,
                "clone": 220, "bpf": 280, "keyctl": 219, "perf_event_open": 241,
                "userfaultfd": 282},
}
_CLONE_NEWNS = 0x00020000
_CLONE_FS = 0x00000200


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


def _sys(nr: int, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args))
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _landlock_abi() -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(_LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                      ctypes.c_uint32(1))
    return int(rc) if rc > 0 else 0


def _walls(granted: str, outside: str, caller: int) -> dict[str, object]:
    ops: dict[str, object] = {}

    def create(folder: str) -> None:
        path = os.path.join(folder, "probe")
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(path)

    if granted:
        ops["fs_write_granted"] = _try(lambda: create(granted))
    if outside:
        ops["fs_write_outside"] = _try(lambda: create(outside))
        ops["fs_read_outside"] = _try(lambda: os.listdir(outside))
    if caller:
        ops["signal_outside"] = _try(lambda: os.kill(caller, 0))
    nr = _NR.get(os.uname().machine)
    if nr:
        me = os.getpid()
        ops["ptrace"] = _try(lambda: _sys(nr["ptrace"], 0x7FFF, me, 0, 0))  # unknown request
        ops["process_vm_readv"] = _try(lambda: _sys(nr["process_vm_readv"], me, 0, 0, 0, 0, 0))
        ops["kcmp"] = _try(lambda: _sys(nr["kcmp"], me, me, 0x7FFF, 0, 0))  # unknown type
        ops["unshare"] = _try(lambda: _sys(nr["unshare"], 0))  # a no-op unfiltered
        ops["clone_newns"] = _try(lambda: _sys(nr["clone"], _CLONE_NEWNS | _CLONE_FS, 0, 0, 0, 0))
        ops["bpf"] = _try(lambda: _sys(nr["bpf"], 0x7FFF, 0, 0))
        ops["keyctl"] = _try(lambda: _sys(nr["keyctl"], 0x7FFF, 0, 0, 0, 0))
        ops["perf_event_open"] = _try(lambda: _sys(nr["perf_event_open"], 0, 0, -1, -1, 0))
        ops["userfaultfd"] = _try(lambda: _sys(nr["userfaultfd"], 0x7FFF0000))
        ops["clone3"] = _try(lambda: _sys(_CLONE3, 0, 0))
    ops["dev_list"] = _try(lambda: os.listdir("/dev"))

    def basic_devices() -> None:
        for name in ("null", "zero", "full", "random", "urandom"):
            os.close(os.open(f"/dev/{name}", os.O_RDWR))

    ops["dev_basic"] = _try(basic_devices)
    return ops


def run(parent_netns: str, granted: str = "", outside: str = "", caller: int = 0) -> dict:
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
    if sys.platform.startswith("linux"):
        ops.update(_walls(granted, outside, caller))
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
                if key in ("NoNewPrivs", "Seccomp", "Uid", "CapInh", "CapPrm", "CapEff",
                           "CapBnd", "CapAmb"):
                    status[key] = value.strip()
    except OSError:
        pass
    try:
        own_netns = bool(parent_netns) and os.readlink("/proc/self/ns/net") != parent_netns
    except OSError:
        own_netns = False
    return {"ops": ops, "status": status, "own_netns": own_netns,
            "landlock_abi": _landlock_abi() if sys.platform.startswith("linux") else 0}


if __name__ == "__main__":
    a = sys.argv[1:] + [""] * 4
    print(json.dumps(run(a[0], a[1], a[2], int(a[3] or 0))))
