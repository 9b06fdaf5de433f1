"""File-open flags and file modes as this system has them, for the agent's few direct opens.

POSIX has them all; Windows lacks ``O_NOFOLLOW``, ``O_NONBLOCK`` and ``O_DIRECTORY`` (0 or None
here), keeps handles from children with ``O_NOINHERIT`` instead of ``O_CLOEXEC``, and reports
every file as mode 0666 there: who may read a file is its DACL's to say, not its mode's.
"""

from __future__ import annotations

import os

__all__ = ["NOFOLLOW", "NONBLOCK", "NOT_INHERITED", "DIRECTORY", "MODES_GUARD"]

NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)  # not through a link
NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)  # never waiting on a fifo
NOT_INHERITED: int = getattr(os, "O_CLOEXEC", getattr(os, "O_NOINHERIT", 0))
DIRECTORY: int | None = getattr(os, "O_DIRECTORY", None)  # None: no folder to open and fsync
MODES_GUARD: bool = hasattr(os, "fchmod")  # a file's mode says who may read it (POSIX)
