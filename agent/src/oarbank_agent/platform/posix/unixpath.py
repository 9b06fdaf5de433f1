"""Unix socket paths of any length: bind and connect through the directory's descriptor.

A unix socket address holds at most ``sun_path`` bytes (108 on Linux including the final NUL,
104 on macOS and the BSDs), so ``bind``/``connect`` on ``<a deep state dir>/control.sock``
fail with "AF_UNIX path too long". On Linux the directory is opened (``O_PATH``) and the socket
is named ``/proc/self/fd/<n>/<name>``: the kernel resolves the directory through the
descriptor, the socket file lands in the real directory, and the address stays short whatever
the directory's path. Where that is not available the error names the path and the limit.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from oarbank_agent.platform.api import EndpointPathTooLong

__all__ = ["SUN_PATH_MAX", "SocketPathTooLong", "check", "socket_address"]

# Bytes of sun_path, including the terminating NUL the kernel may need.
SUN_PATH_MAX = 108 if sys.platform.startswith("linux") else 104
_PROC_FD = "/proc/self/fd"


class SocketPathTooLong(EndpointPathTooLong):
    """The socket's path is over the unix socket limit and cannot be shortened here."""

    def __init__(self, path: Path) -> None:
        n = len(os.fsencode(str(path)))
        super().__init__(f"unix socket path {path} is {n} bytes; unix sockets allow at most "
                         f"{SUN_PATH_MAX - 1} here: use a shorter --state-dir")
        self.path = path


def _fits(address: str) -> bool:
    return len(os.fsencode(address)) < SUN_PATH_MAX


def _shortcut_available(shortcut: bool) -> bool:
    return shortcut and getattr(os, "O_PATH", None) is not None and os.path.isdir(_PROC_FD)


def check(path: Path, *, shortcut: bool = True) -> None:
    """Raise ``SocketPathTooLong`` if ``socket_address(path)`` could never give an address
    (checked before anything is started; the directory need not exist yet). ``shortcut``
    False: never use ``/proc`` (the macOS profile, which has none)."""
    if not _fits(str(path)) and not (_shortcut_available(shortcut) and _fits(
            f"{_PROC_FD}/{2**31 - 1}/{path.name}")):
        raise SocketPathTooLong(path)


@contextlib.contextmanager
def socket_address(path: Path, *, shortcut: bool = True) -> Iterator[str]:
    """An address for ``bind``/``connect`` naming ``path``, valid inside the ``with`` block.

    ``path`` itself when it fits; else (Linux) ``/proc/self/fd/<n>/<name>`` through a
    descriptor of its directory, closed on leaving the block (a bound or connected socket
    does not need it afterwards). Raises ``SocketPathTooLong`` where neither works, and
    ``FileNotFoundError`` if the directory does not exist.
    """
    address = str(path)
    if _fits(address):
        yield address
        return
    if not _shortcut_available(shortcut):
        raise SocketPathTooLong(path)
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        short = f"{_PROC_FD}/{fd}/{path.name}"
        if not _fits(short):
            raise SocketPathTooLong(path)  # the name alone is too long
        yield short
    finally:
        os.close(fd)
