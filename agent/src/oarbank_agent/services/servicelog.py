"""A service's log, ``modules/<id>/logs/<service>.log``, collected by the agent and rotated by
size.

The ``start`` op's stderr is a pipe the agent reads (on the event loop, no thread), not the
file: the daemon it leaves inherits that pipe, so everything the daemon (and whatever it
starts) writes to stderr reaches the log whatever the module does with files of its own, and
the file is rotated at ``--log-max-mb`` (``<service>.log.1`` .. ``.N``, ``--log-backups``) so
a chatty daemon never fills the node's disk. A daemon that fills the pipe while the agent is
busy waits for it (the kernel's pipe buffer), never loses lines.

The other ops write to a file of their own and ``ops.py`` appends it here (``append_file``),
through the same rotation.

``mark``/``since`` give the bytes written from one moment on (the start's part, quoted when a
start fails), from memory (the last ``TAIL`` bytes): rotation never loses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from oarbank_agent import platform

__all__ = ["ServiceLog", "configure", "get", "close_all", "TAIL"]

TAIL = 64 * 1024  # bytes kept in memory for ``since`` (a failed start quotes its end)
_CHUNK = 64 * 1024

_max_bytes = 10 * 2**20
_backups = 5
_logs: dict[Path, ServiceLog] = {}


def configure(max_bytes: int, backups: int) -> None:
    """``--log-max-mb`` / ``--log-backups`` (cli.py, before anything starts)."""
    global _max_bytes, _backups
    _max_bytes, _backups = max_bytes, backups


def get(path: Path) -> ServiceLog:
    """The one ServiceLog of ``path`` (created on first use)."""
    log = _logs.get(path)
    if log is None:
        log = _logs[path] = ServiceLog(path, _max_bytes, _backups)
    return log


def close_all() -> None:
    """Agent stop: every service has ended; what is left in the pipes is written."""
    for log in list(_logs.values()):
        log.close()
    _logs.clear()


class ServiceLog:
    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.total = 0  # bytes written through this object since the agent started
        self._tail = bytearray()
        self._readers: set[int] = set()  # read ends of the pipes of live daemons
        self._latest: int | None = None  # the newest start's (--keep-services keeps it)

    # --- the pipe ---------------------------------------------------------------------------

    def open_writer(self) -> int:
        """A new pipe; returns its write end for the ``start`` op's stderr (the caller closes
        it once the child has it). The read end is watched on the running loop until every
        writer is gone (EOF)."""
        streams = platform.current().streams
        r, w = streams.pipe()
        self._watch(r)
        self._latest = r
        return w

    def _watch(self, r: int) -> None:
        self._readers.add(r)
        platform.current().streams.watcher(asyncio.get_running_loop()).on_readable(
            r, self._readable, r)

    def latest_reader(self) -> int | None:
        """The read end of the newest start's pipe while it is open (its daemon's stderr):
        what a keeper holds across an agent restart (``--keep-services``)."""
        return self._latest if self._latest in self._readers else None

    def resume(self, r: int) -> None:
        """Read a kept daemon's stderr again: the read end a keeper held while no agent ran
        (what the daemon wrote meanwhile waited in the pipe). Ours to close from now on."""
        os.set_blocking(r, False)  # as the pipes ``open_writer`` makes (POSIX: only it keeps)
        self._watch(r)
        self._latest = r

    def _readable(self, r: int) -> None:
        try:
            chunk = platform.current().streams.read_some(r, _CHUNK)
        except OSError:
            chunk = b""
        if chunk is None:
            return
        if chunk:
            self._write(chunk)
        else:  # EOF: the daemon and everything that held its stderr are gone
            self._close_reader(r)

    def drain(self) -> None:
        """Read what the pipes hold now (before quoting a start's output)."""
        for r in list(self._readers):
            while r in self._readers:
                try:
                    chunk = platform.current().streams.read_some(r, _CHUNK)
                except OSError:
                    chunk = b""
                if chunk is None:
                    break
                if not chunk:
                    self._close_reader(r)
                    break
                self._write(chunk)

    def _close_reader(self, r: int) -> None:
        self._readers.discard(r)
        with contextlib.suppress(Exception):
            platform.current().streams.watcher(asyncio.get_running_loop()).off_readable(r)
        with contextlib.suppress(OSError):
            platform.current().streams.close_read_end(r)

    def close(self) -> None:
        self.drain()
        for r in list(self._readers):
            self._close_reader(r)

    # --- the file ---------------------------------------------------------------------------

    def mark(self) -> int:
        self.drain()
        return self.total

    def since(self, mark: int) -> str:
        """What was written after ``mark`` (at most the last ``TAIL`` bytes of it)."""
        self.drain()
        n = min(self.total - mark, len(self._tail))
        return bytes(self._tail[len(self._tail) - n:]).decode("utf-8", errors="replace") \
            if n > 0 else ""

    def append_file(self, src: Path, limit: int, note: str) -> None:
        """Append the last ``limit`` bytes of ``src`` (an op's own stderr file), in chunks."""
        with open(src, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size > limit:
                self._write(note.format(left_out=size - limit).encode())
            f.seek(max(0, size - limit))
            while chunk := f.read(_CHUNK):
                self._write(chunk)

    def _write(self, data: bytes) -> None:
        self.total += len(data)
        self._tail += data
        del self._tail[:-TAIL]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            while data:
                room = self.max_bytes - size
                if len(data) <= room:
                    self._append(data)
                    break
                # The whole lines that fit, then a new file: no file passes the limit and no
                # line is cut (except one longer than a whole file).
                cut = data.rfind(b"\n", 0, max(room, 0)) + 1
                if cut == 0 and size == 0:
                    cut = room
                if cut:
                    self._append(data[:cut])
                    data = data[cut:]
                self._rotate()
                size = 0
        except OSError:
            pass  # a full disk must not stop the agent reading the pipe (the daemon would block)

    def _append(self, data: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(data)

    def _rotate(self) -> None:
        """<service>.log -> .1 -> .2 ... (the oldest beyond ``backups`` is dropped)."""
        if not self.path.exists():
            return
        for i in range(self.backups - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{i}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{i + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
