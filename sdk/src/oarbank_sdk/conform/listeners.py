"""Which of a set of processes hold a socket anyone could reach: the conformance kit's
"never listens" check (contract sections 3 and 8).

A socket counts as listening when it is:
- TCP in the LISTEN state (IPv4 or IPv6);
- UDP bound to a port and not connected (it receives from anyone who knows the port);
- unix (path or abstract name) marked accepting connections, or a named datagram socket.

Linux: each process's socket inodes (``/proc/<pid>/fd``) are looked up in the socket tables of
*that process's* network namespace (``/proc/<pid>/net/...``): a service in a private namespace
is still seen. Elsewhere (macOS): psutil's per-process connections (``_psutil_listeners``,
tested on Linux too against the ``/proc`` reading). psutil cannot tell a listening unix stream
socket from one accepted on it (neither has a peer address, both show the bound name), so there
every unix stream socket with a name counts: a service is handed its connections, never
accepts them, and has no reason to hold either.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import socket
import sys
from dataclasses import dataclass

import psutil

__all__ = ["Listener", "listeners", "blind_spot", "related_pids", "split_gpu_driver"]

_TCP_LISTEN = "0A"
_TCP_CLOSE = "07"  # an unconnected UDP socket shows this state
_UNIX_ACCEPTCON = 0x10000  # __SO_ACCEPTCON: listen() was called
_UNIX_DGRAM = 2


@dataclass(frozen=True)
class Listener:
    pid: int
    kind: str  # "tcp", "tcp6", "udp", "udp6", "unix"
    address: str

    def __str__(self) -> str:
        what = {"tcp": "TCP", "tcp6": "TCP", "udp": "UDP", "udp6": "UDP", "unix": "unix"}[self.kind]
        verb = "bound" if self.kind.startswith("udp") else "listening on"
        return f"pid {self.pid}: {what} {verb} {self.address}"


def split_gpu_driver(found: list[Listener], gpu: bool) -> tuple[list[Listener], list[Listener]]:
    """(the listeners that fail the check, those a GPU child's driver may hold). A module with
    ``[sandbox].devices.gpu = "compute"`` runs with the launcher's ``--gpu``: its driver may
    listen on an abstract unix name (CUDA's ``@cuda-uvmfd-...``), which lives in the child's
    own network namespace under Landlock's abstract-socket scope, so nothing outside its
    sandbox can reach it. Any other listener, or any listener of another module, fails."""
    if not gpu:
        return list(found), []
    driver = [x for x in found if x.kind == "unix" and x.address.startswith("@")]
    return [x for x in found if x not in driver], driver


def related_pids(pgid: int | None, extra: tuple[int, ...] = ()) -> set[int]:
    """Processes of group ``pgid``, plus ``extra`` pids and all their descendants (a process
    that left the group is still the service's)."""
    found: set[int] = set()
    if sys.platform == "win32":  # no process groups there: the job object's processes
        from oarbank_sdk.conform import host

        found.update(host.group_pids(pgid) if pgid is not None else ())
    elif pgid is not None:
        for p in psutil.process_iter():
            with contextlib.suppress(psutil.Error, OSError):
                if os.getpgid(p.pid) == pgid:
                    found.add(p.pid)
    for pid in list(found) + list(extra):
        with contextlib.suppress(psutil.Error):
            found.add(pid)
            found.update(c.pid for c in psutil.Process(pid).children(recursive=True))
    return {pid for pid in found if psutil.pid_exists(pid)}


@functools.cache
def blind_spot() -> str | None:
    """Why ``listeners`` cannot be trusted here, or None. Linux reads ``/proc``; elsewhere
    psutil must name the process of a socket, which some systems do not (Wine shows every
    connection with pid 0): the kit's own loopback listener must be seen, else the check
    would pass whatever a service holds."""
    if _reads_proc():
        return None
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.bind(("127.0.0.1", 0))
        probe.listen(1)
        port = probe.getsockname()[1]
        seen = any(x.kind == "tcp" and x.address.endswith(f":{port}")
                   for x in _psutil_listeners([os.getpid()]))
    finally:
        probe.close()
    if seen:
        return None
    return (f"psutil names no process for sockets on this system ({sys.platform}: the kit's "
            "own listening socket was not seen as its own; Wine does this)")


def listeners(pids: set[int] | list[int]) -> list[Listener]:
    """Every listening socket held by any of ``pids``."""
    return _linux_listeners(pids) if _reads_proc() else _psutil_listeners(pids)


def _reads_proc() -> bool:
    """Linux with its ``/proc`` (each process's own network namespace); else psutil."""
    return sys.platform.startswith("linux") and os.path.isdir("/proc/self/net")


# --- Linux ---------------------------------------------------------------------------------


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _ip(hex_addr: str) -> str:
    addr, port = hex_addr.split(":")
    raw = bytes.fromhex(addr)
    # /proc prints each 32-bit word in host byte order
    words = [raw[i : i + 4][::-1] if sys.byteorder == "little" else raw[i : i + 4]
             for i in range(0, len(raw), 4)]
    ip = ipaddress.ip_address(b"".join(words))
    return f"[{ip}]:{int(port, 16)}" if ip.version == 6 else f"{ip}:{int(port, 16)}"


def _inet_table(pid: int, kind: str) -> dict[str, Listener]:
    """inode -> Listener for the listening sockets of one /proc/<pid>/net table."""
    found: dict[str, Listener] = {}
    try:
        with open(f"/proc/{pid}/net/{kind}", encoding="ascii") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
        port = int(local.split(":")[1], 16)
        remote_port = int(remote.split(":")[1], 16)
        if kind.startswith("tcp"):
            listening = state == _TCP_LISTEN
        else:
            listening = state == _TCP_CLOSE and port != 0 and remote_port == 0
        if listening:
            found[inode] = Listener(pid, kind, _ip(local))
    return found


def _unix_table(pid: int) -> dict[str, Listener]:
    found: dict[str, Listener] = {}
    try:
        with open(f"/proc/{pid}/net/unix", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split(None, 7)
        if len(fields) < 7:
            continue
        flags, stype, inode = int(fields[3], 16), int(fields[4], 16), fields[6]
        path = fields[7] if len(fields) > 7 else ""
        if flags & _UNIX_ACCEPTCON or (stype == _UNIX_DGRAM and path):
            found[inode] = Listener(pid, "unix", path or "(unnamed)")
    return found


def _linux_listeners(pids: set[int] | list[int]) -> list[Listener]:
    result: list[Listener] = []
    tables: dict[int, dict[str, Listener]] = {}  # per network namespace
    for pid in sorted(pids):
        inodes = _socket_inodes(pid)
        if not inodes:
            continue
        try:
            ns = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            ns = -pid
        if ns not in tables:
            table: dict[str, Listener] = {}
            for kind in ("tcp", "tcp6", "udp", "udp6"):
                table.update(_inet_table(pid, kind))
            table.update(_unix_table(pid))
            tables[ns] = table
        for inode in sorted(inodes):
            hit = tables[ns].get(inode)
            if hit is not None:
                result.append(Listener(pid, hit.kind, hit.address))
    return result


# --- elsewhere -----------------------------------------------------------------------------


def _psutil_listeners(pids: set[int] | list[int]) -> list[Listener]:
    """``listeners`` through psutil (macOS, Windows; callable on Linux, where the tests compare
    it with the ``/proc`` reading)."""
    result = []
    unix = getattr(socket, "AF_UNIX", None)
    for pid in sorted(pids):
        try:
            proc = psutil.Process(pid)
            conns = (proc.net_connections if hasattr(proc, "net_connections")
                     else proc.connections)(kind="all")
        except psutil.Error:
            continue
        for c in conns:
            family = {socket.AF_INET: "", socket.AF_INET6: "6"}.get(c.family)
            if unix is not None and c.family == unix:
                named = bool(c.laddr) and not c.raddr
                hit = Listener(pid, "unix", str(c.laddr) or "(unnamed)")
                if (c.status == psutil.CONN_LISTEN or named) and hit not in result:
                    result.append(hit)  # once: an accepted socket shows the same name
            elif family is not None and c.laddr and c.laddr.port:
                addr = (f"[{c.laddr.ip}]:{c.laddr.port}" if family
                        else f"{c.laddr.ip}:{c.laddr.port}")
                if c.type == socket.SOCK_STREAM and c.status == psutil.CONN_LISTEN:
                    result.append(Listener(pid, "tcp" + family, addr))
                elif c.type == socket.SOCK_DGRAM and not c.raddr:
                    result.append(Listener(pid, "udp" + family, addr))
    return result
