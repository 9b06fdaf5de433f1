"""The macOS backend: POSIX process groups watched by polling, psutil for the process table,
Seatbelt (through the SDK's launcher); no cgroups, no pidfds, no ``/proc``.

On Linux, ``OARBANK_PLATFORM=darwin`` runs this backend as a test profile.
"""

from __future__ import annotations

from oarbank_agent.platform.api import Backend

__all__ = ["backend"]


def backend() -> Backend:
    return Backend(name="darwin")
