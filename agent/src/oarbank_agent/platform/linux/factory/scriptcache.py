"""Scripts run in place, compiled once: the factory keeps each one's code object for its next
children, so a runner or op that runs again does not compile its script again (2-3 ms of a
trivial runner's child, and most of its page faults before the script's first line).

What a child runs must be what ``python -I script.py`` would compile at that moment, so:

- the code is compiled as a fresh start compiles ``__main__`` (no inherited ``__future__``
  flags, the interpreter's own optimisation level: ``plan.in_place`` admits only ``-I``);
- it is tied to the file it came from by a ``Stamp`` (device, inode, size, modification and
  change times, read before and after the source); the child opens the script itself and uses
  the code only if its own ``fstat`` gives the same stamp, else it compiles as before;
- a file changed within the last ``SETTLE_S`` is not kept yet (a write in progress could
  still land under the same times: git's "racily clean" rule);
- a script whose compilation says anything (a ``SyntaxWarning``, a ``DeprecationWarning`` for
  an escape) or fails is never kept: each child compiles it and says it, as a fresh start does;
- a compiled file (``.pyc`` magic) or anything not a plain file goes runpy's way each time.

The factory compiles a script after answering the spawn that first ran it (off that spawn's
path), from the file the bundle holds: source only, never run here; at most ``MAX_SOURCE``
bytes (the factory serves one spawn at a time: a bigger script is each child's to compile);
at most ``MAX_SCRIPTS`` kept (least recently used goes first). A source that makes the
compiler give up (nesting too deep, out of memory) is refused like a syntax error. Children
cannot write to a bundle (their walls), and the child's own stamp check is what decides.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import time
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from types import CodeType
from typing import Any

from oarbank_agent.platform.linux.factory import plan
from oarbank_sdk import sandbox

__all__ = ["Stamp", "Compiled", "ScriptCache", "stamp_of", "readable_stamp", "SETTLE_S",
           "MAX_SOURCE", "MAX_SCRIPTS"]

SETTLE_S = 2.0
MAX_SOURCE = 64 << 10  # compiling 64 KiB holds every spawn ~15-75 ms, once a version
MAX_SCRIPTS = 64

Stamp = tuple[int, int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns


def stamp_of(st: os.stat_result) -> Stamp:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


@dataclass(frozen=True)
class Compiled:
    """A script's code as a fresh start would compile it, and the file it came from."""

    path: str
    stamp: Stamp
    code: CodeType


def _open(path: str) -> int | None:
    """A descriptor to read ``path`` through (never blocks on a FIFO), or None."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None


def readable_stamp(path: str) -> Stamp | None:
    """The stamp of ``path`` if it is a plain file this process can open, else None: what a
    child checks the factory's compiled copy against before it runs it."""
    fd = _open(path)
    if fd is None:
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return stamp_of(st) if stat.S_ISREG(st.st_mode) else None


def compile_script(path: str, now: float | None = None) -> Compiled | Stamp | None:
    """``path`` compiled as ``python -I path`` would; or the stamp of a file that must never be
    kept as it is (see the module's rules); or None: not now (unreadable, changing, too new).
    Never raises for what the file holds."""
    fd = _open(path)
    if fd is None:
        return None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode) or before.st_size > MAX_SOURCE:
            return stamp_of(before)
        if (now if now is not None else time.time()) - before.st_mtime_ns / 1e9 < SETTLE_S:
            return None
        chunks, left = [], before.st_size + 1
        while left > 0:
            data = os.read(fd, left)
            if not data:
                break
            chunks.append(data)
            left -= len(data)
        after = os.fstat(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    source = b"".join(chunks)
    if stamp_of(before) != stamp_of(after) or len(source) != after.st_size:
        return None  # changed under the read
    if source[:4] == importlib.util.MAGIC_NUMBER:
        return stamp_of(after)  # a compiled file: runpy reads it itself
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a warning is the child's to print: not kept
            code = compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError, Warning):
        return stamp_of(after)
    return Compiled(path, stamp_of(after), code)


def script_of(argv: Sequence[str], env: dict[str, str], python: str, boot: str,
              locale: dict[str, str]) -> str | None:
    """The script a spawn of ``argv`` would run in place (``plan``'s two decisions), if any."""
    try:
        launch = plan.split_launch(argv, python, boot)
    except sandbox.UsageError:
        return None
    found = plan.in_place(launch.command, python, env, locale)
    if found is None or not os.path.isabs(found[0]):
        return None
    return found[0]


class ScriptCache:
    """The factory's compiled scripts, by path (least recently used first)."""

    def __init__(self, limit: int = MAX_SCRIPTS) -> None:
        self.limit = limit
        self._by_path: OrderedDict[str, Compiled] = OrderedDict()
        self._refused: OrderedDict[str, Stamp] = OrderedDict()  # not kept while unchanged

    def offer(self, path: str | None) -> Compiled | None:
        """What a child about to run ``path`` may use, if the file still is what was compiled
        (the child checks the stamp again on its own descriptor)."""
        if path is None:
            return None
        got = self._by_path.get(path)
        if got is None:
            return None
        try:
            current = stamp_of(os.stat(path))
        except OSError:
            current = None
        if current != got.stamp:
            del self._by_path[path]
            return None
        self._by_path.move_to_end(path)
        return got

    def learn(self, path: str | None) -> None:
        """Compile ``path`` for the next children (after a child that had no offer)."""
        if path is None or path in self._by_path:
            return
        refused = self._refused.get(path)
        if refused is not None:
            try:
                if stamp_of(os.stat(path)) == refused:
                    return  # the same file that was not kept: each child compiles it
            except OSError:
                return
        got = compile_script(path)
        if got is None:
            return
        self._refused.pop(path, None)
        table: OrderedDict[str, Any] = self._refused if isinstance(got, tuple) else self._by_path
        table[path] = got
        while len(table) > self.limit:
            table.popitem(last=False)

    def __len__(self) -> int:
        return len(self._by_path)
