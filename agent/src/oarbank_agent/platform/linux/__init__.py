"""The Linux backend: POSIX process groups in cgroups v2, pidfds, ``/proc``, Landlock and
seccomp (through the SDK's launcher).

Files (one sentence each): see each module's first line; ``backend()`` assembles the parts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oarbank_agent.platform.api import Backend

__all__ = ["backend"]


def backend() -> Backend:
    # Imported here, not above: the process factory (``linux/factory/``) imports this
    # package on its way and must not load the agent's side of the backend.
    from oarbank_agent.platform.api import Backend
    from oarbank_agent.platform.linux import proctable
    from oarbank_agent.platform.linux.factoryhost import LinuxFactoryHost
    from oarbank_agent.platform.linux.groups import LinuxGroups
    from oarbank_agent.platform.linux.sandboxhost import LinuxSandboxHost
    from oarbank_agent.platform.linux.servicemanager import SystemdManager
    from oarbank_agent.platform.linux.sessions import LinuxSessions
    from oarbank_agent.platform.posix.endpoint import UnixEndpoint
    from oarbank_agent.platform.posix.keeper import PosixKeeperHost
    from oarbank_agent.platform.posix.loops import SelectorLoops
    from oarbank_agent.platform.posix.nudges import SignalNudges
    from oarbank_agent.platform.posix.requests import SignalRequests
    from oarbank_agent.platform.posix.statedir import PosixStateDir
    from oarbank_agent.platform.posix.streams import PosixStreams
    from oarbank_agent.platform.posix.tether import PosixTetherHost

    return Backend(name="linux", sessions=LinuxSessions(), sandbox=LinuxSandboxHost(),
                   # the control plane and the agent's I/O
                   streams=PosixStreams(cloexec_pipe=True),
                   endpoint=UnixEndpoint(shortcut=True),
                   statedir=PosixStateDir(proc_status=True),
                   requests=SignalRequests(), loops=SelectorLoops(),
                   factory=LinuxFactoryHost(),
                   # process groups, their limits and containment
                   groups=LinuxGroups(),
                   keeper=PosixKeeperHost(shortcut=True, started=proctable.start_ticks),
                   service_manager=SystemdManager(),
                   # runners killed when the agent dies; told their control.json changed
                   tether=PosixTetherHost(), nudges=SignalNudges())
