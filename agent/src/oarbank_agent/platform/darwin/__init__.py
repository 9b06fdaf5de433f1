"""The macOS backend: POSIX process groups watched by polling, psutil for the process table,
Seatbelt (through the SDK's launcher); no cgroups, no pidfds, no ``/proc``.

On Linux, ``OARBANK_PLATFORM=darwin`` runs this backend as a test profile: ``backend()``
first installs the tripwire (``linuxfree.py``), so that a Linux-only call fails, naming itself.
"""

from __future__ import annotations

import psutil

from oarbank_agent.platform.api import Backend
from oarbank_agent.platform.darwin import linuxfree
from oarbank_agent.platform.darwin.sandboxhost import DarwinSandboxHost
from oarbank_agent.platform.posix.endpoint import UnixEndpoint
from oarbank_agent.platform.posix.factoryhost import PosixFactoryHost
from oarbank_agent.platform.posix.groups import PosixGroups
from oarbank_agent.platform.posix.keeper import PosixKeeperHost
from oarbank_agent.platform.posix.loops import SelectorLoops
from oarbank_agent.platform.posix.nudges import SignalNudges
from oarbank_agent.platform.posix.requests import SignalRequests
from oarbank_agent.platform.posix.sessions import PosixSessions
from oarbank_agent.platform.posix.statedir import PosixStateDir
from oarbank_agent.platform.posix.streams import PosixStreams
from oarbank_agent.platform.posix.tether import PosixTetherHost

__all__ = ["backend"]


def backend() -> Backend:
    linuxfree.install()  # before any part is made: on a Mac it does nothing
    return Backend(name="darwin", sessions=PosixSessions(), sandbox=DarwinSandboxHost(),
                   # the control plane and the agent's I/O (no pipe2, no /proc)
                   streams=PosixStreams(cloexec_pipe=False),
                   endpoint=UnixEndpoint(shortcut=False),
                   statedir=PosixStateDir(proc_status=False),
                   requests=SignalRequests(), loops=SelectorLoops(),
                   factory=PosixFactoryHost(),
                   # process groups only: no limits, polled (psutil's process table)
                   groups=PosixGroups(system="darwin"),
                   keeper=PosixKeeperHost(shortcut=False, started=_started),
                   # runners killed when the agent dies (no PR_SET_PDEATHSIG on macOS)
                   tether=PosixTetherHost(), nudges=SignalNudges())


def _started(pid: int) -> int | None:
    """A process's start time in milliseconds (psutil's), None once it is gone."""
    try:
        return int(psutil.Process(pid).create_time() * 1000)
    except psutil.Error:
        return None
