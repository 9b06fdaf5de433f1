"""The platform backend: everything the agent asks of the operating system, chosen once.

Nothing outside this package names a process group id, a cgroup, ``/proc``, a pidfd,
``flock``, ``fcntl``, ``prctl``, ``add_reader``/``add_writer``, ``AF_UNIX`` or a signal
(``agent/tests/test_platform_seam.py`` fails naming file and line when something does). The
rest of the agent calls ``current()`` and uses what ``api.Backend`` offers.

Each file in one sentence: ``README.md`` here. The choice is made once per process (the first
``current()``) and never changes.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from oarbank_agent.platform.choice import choose

if TYPE_CHECKING:
    from oarbank_agent.platform.api import Backend

__all__ = ["current", "name"]

_backend: Backend | None = None


def name() -> str:
    """The chosen backend's name (``linux``, ``darwin``, ``windows``), without loading it."""
    return choose(sys.platform, os.environ)


def current() -> Backend:
    """The backend of this process, loaded on first use."""
    global _backend
    if _backend is None:
        chosen = name()
        if chosen == "linux":
            from oarbank_agent.platform.linux import backend
        elif chosen == "darwin":
            from oarbank_agent.platform.darwin import backend
        else:
            from oarbank_agent.platform.windows import backend
        _backend = backend()
    return _backend
