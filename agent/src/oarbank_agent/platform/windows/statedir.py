"""The state-dir lock on Windows: ``LockFileEx`` on ``agent.lock``, no user names by number,
the umask as the C runtime keeps it.

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
from typing import Any

from oarbank_agent.platform.windows import winapi

__all__ = ["WindowsStateDir", "LOCK_OFFSET"]

LOCK_OFFSET = 2**62  # no agent.lock ever holds that much
_msvcrt: Any = importlib.import_module("msvcrt") if sys.platform == "win32" else None


class WindowsStateDir:
    """``api.StateDirHost`` on Windows."""

    def try_lock(self, fd: int) -> bool:
        handle = _msvcrt.get_osfhandle(fd)  # OSError (EBADF) for a descriptor not open
        return winapi.lock_file(handle, LOCK_OFFSET)

    def user_name(self, uid: int) -> str | None:
        return None  # no uid names a user here (see the module docstring)

    def umask(self) -> int:
        mask = os.umask(0o077)  # the CRT's own mask: set and put back at once
        os.umask(mask)
        return mask
