"""The Linux backend: POSIX process groups in cgroups v2, pidfds, ``/proc``, Landlock and
seccomp (through the SDK's launcher).

Files (one sentence each): see each module's first line; ``backend()`` assembles the parts.
"""

from __future__ import annotations

from oarbank_agent.platform.api import Backend
from oarbank_agent.platform.linux.groups import LinuxGroups

__all__ = ["backend"]


def backend() -> Backend:
    return Backend(name="linux", groups=LinuxGroups())
