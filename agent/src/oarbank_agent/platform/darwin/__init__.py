"""The macOS backend: POSIX process groups watched by polling, psutil for the process table,
Seatbelt (through the SDK's launcher); no cgroups, no pidfds, no ``/proc``.

On Linux, ``OARBANK_PLATFORM=darwin`` runs this backend as a test profile: ``backend()``
first installs the tripwire (``linuxfree.py``), so that a Linux-only call fails, naming itself.
"""

from __future__ import annotations

from oarbank_agent.platform.api import Backend
from oarbank_agent.platform.darwin import linuxfree
from oarbank_agent.platform.posix.groups import PosixGroups

__all__ = ["backend"]


def backend() -> Backend:
    linuxfree.install()  # before any part is made: on a Mac it does nothing
    return Backend(name="darwin", groups=PosixGroups())
