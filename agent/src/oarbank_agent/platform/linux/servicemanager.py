"""systemd's service manager protocol, spoken directly (no libsystemd, no new dependency).

- Notifications: one datagram to ``$NOTIFY_SOCKET`` (a path, or ``@name`` for an abstract
  address), newline-separated ``KEY=value`` fields, descriptors with it as SCM_RIGHTS:
  ``READY=1``, ``STOPPING=1``, ``FDSTORE=1`` + ``FDNAME=`` (keep these descriptors for the
  next start of the unit), ``FDSTOREREMOVE=1`` + ``FDNAME=`` (drop those of that name).
- Descriptors handed back at a start: ``$LISTEN_FDS`` of them from fd 3 on, named by
  ``$LISTEN_FDNAMES`` (colon-separated), for this process only (``$LISTEN_PID``).

The unit must say ``Type=notify`` and ``FileDescriptorStoreMax=`` (agent/systemd/).
"""

from __future__ import annotations

import array
import os
import socket
from collections.abc import Mapping

__all__ = ["SystemdManager", "parse_handed_back", "LISTEN_FDS_START"]

LISTEN_FDS_START = 3  # SD_LISTEN_FDS_START
_LISTEN_VARS = ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES")


def _address(raw: str) -> str | bytes:
    return b"\0" + raw[1:].encode() if raw.startswith("@") else raw


def parse_handed_back(environ: Mapping[str, str], pid: int) -> list[tuple[str, int]]:
    """(name, fd) of each descriptor the service manager handed to ``pid`` (pure). Names
    missing from ``LISTEN_FDNAMES`` are ``unknown``, as systemd names them."""
    if environ.get("LISTEN_PID") != str(pid):
        return []
    try:
        n = int(environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return []
    names = environ.get("LISTEN_FDNAMES", "").split(":") if environ.get("LISTEN_FDNAMES") else []
    return [(names[i] if i < len(names) and names[i] else "unknown", LISTEN_FDS_START + i)
            for i in range(max(n, 0))]


class SystemdManager:
    """``api.ServiceManager`` on Linux: present when ``$NOTIFY_SOCKET`` is set."""

    def __init__(self) -> None:
        self._handed: list[tuple[str, int]] | None = None
        self._socket: str | None = None

    def _notify_socket(self) -> str:
        """Taken out of the environment at first use, as sd_notify(unset_environment) does:
        the agent's children (services, jobs) are not the unit's main process."""
        if self._socket is None:
            self._socket = os.environ.pop("NOTIFY_SOCKET", "")
        return self._socket

    def active(self) -> bool:
        return bool(self._notify_socket())

    def notify(self, fields: Mapping[str, str], fds: tuple[int, ...] = ()) -> bool:
        """Send ``fields`` (and ``fds``) to the service manager; False when there is none.
        Raises OSError when it is there and the datagram cannot be sent."""
        raw = self._notify_socket()
        if not raw:
            return False
        text = "".join(f"{k}={v}\n" for k, v in fields.items()).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            if fds:
                rights = array.array("i", fds).tobytes()
                sock.sendmsg([text], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)], 0,
                             _address(raw))
            else:
                sock.sendto(text, _address(raw))
        return True

    def handed_back(self) -> list[tuple[str, int]]:
        """The descriptors handed to this process at its start, taken once: they are made
        close-on-exec and the variables unset, so no child thinks they are its own."""
        if self._handed is None:
            self._handed = parse_handed_back(os.environ, os.getpid())
            for _name, fd in self._handed:
                os.set_inheritable(fd, False)
            for var in _LISTEN_VARS:
                os.environ.pop(var, None)
        return list(self._handed)

    def store_bytes(self, name: str, data: bytes) -> int:
        """A descriptor holding ``data`` (a memfd), for the descriptor store."""
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read_stored(self, fd: int, limit: int = 1 << 20) -> bytes:
        return os.pread(fd, limit, 0)
