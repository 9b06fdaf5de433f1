"""The state dir on Windows: this user's (the owner's SID) behind a protected DACL
(``privatedir.py``), ``LockFileEx`` on ``agent.lock``, no user names by number, the umask as
the C runtime keeps it.

``LockFileEx`` (not ``msvcrt.locking``, which locks from the file's current position and
retries for ten seconds): an exclusive lock, not waited for, that belongs to the open handle
and goes when it is closed or its process dies. Windows locks are mandatory (they refuse
reads and writes of the locked bytes to other handles), so the byte locked lies far beyond
the file's end: the pid the agent writes at the start stays readable to a second agent's
message. Windows names users by SID, not by number (``os.stat`` says ``st_uid`` 0 for every
file), so ``user_name`` knows no uid.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

from oarbank_agent.platform.api import StateDirRefused
from oarbank_agent.platform.windows import dacl, privatedir, winapi

__all__ = ["WindowsStateDir", "LOCK_OFFSET"]

_O_BINARY = getattr(os, "O_BINARY", 0)  # Windows only
_O_NOINHERIT = getattr(os, "O_NOINHERIT", 0)  # Windows only: not inherited by children
LOCK_OFFSET = 2**62  # no agent.lock ever holds that much
_msvcrt: Any = importlib.import_module("msvcrt") if sys.platform == "win32" else None


class WindowsStateDir:
    """``api.StateDirHost`` on Windows."""

    def claim(self, path: Path) -> None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise StateDirRefused(f"the state dir {path} exists and is not a folder") from None
        except OSError as exc:
            raise StateDirRefused(f"cannot create the state dir {path}: {exc.strerror}") from None
        if not path.is_dir():
            raise StateDirRefused(f"the state dir {path} exists and is not a folder")
        self._check_owner(path, "the state dir ", ": refusing to use a folder another user "
                          "can write (its job and process records would be trusted); use a new "
                          "folder or take ownership of it")
        try:
            privatedir.make_private(path)
        except OSError as exc:
            raise StateDirRefused(f"cannot make the state dir {path} private: {exc}") from None

    def open_private(self, path: Path) -> int:
        if path.is_symlink():  # no O_NOFOLLOW here: a link is refused before the open
            raise StateDirRefused(f"cannot open {path}: it is a link")
        try:
            # In a claimed folder: the file inherits its DACL from its creation.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _O_BINARY | _O_NOINHERIT, 0o600)
        except OSError as exc:
            raise StateDirRefused(f"cannot open {path}: {exc.strerror}") from None
        try:
            self._check_owner(path, "", "")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_owner(self, path: Path, what: str, why: str) -> None:
        try:
            foreign = privatedir.foreign_owner(path)
        except OSError as exc:
            raise StateDirRefused(f"cannot read the owner of {path}: {exc}") from None
        if foreign is not None:
            raise StateDirRefused(f"{what}{path} belongs to {foreign}, not to this agent's user "
                                  f"({privatedir.user_sid()}){why}")

    def others_may_read(self, path: Path, fd: int) -> str | None:
        readers = dacl.other_readers(privatedir.sddl_of(_msvcrt.get_osfhandle(fd)),
                                     privatedir.user_sid())
        if not readers:
            return None
        return (f"its DACL lets {', '.join(readers)} read it; keep it to this user: "
                f"icacls \"{path}\" /inheritance:r /grant:r \"%USERNAME%\":F")

    def try_lock(self, fd: int) -> bool:
        handle = _msvcrt.get_osfhandle(fd)  # OSError (EBADF) for a descriptor not open
        return winapi.lock_file(handle, LOCK_OFFSET)

    def user_name(self, uid: int) -> str | None:
        return None  # no uid names a user here (see the module docstring)

    def umask(self) -> int:
        mask = os.umask(0o077)  # the CRT's own mask: set and put back at once
        os.umask(mask)
        return mask
