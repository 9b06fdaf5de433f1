"""The Windows backend: job objects, overlapped pipes on the proactor loop, handles
duplicated into the processes that get them; the agent runs jobs and services on it (tested
under Wine with Windows' own CPython, and on the ``windows-latest`` runner).

Written (each tested with Windows' own CPython under Wine, ``nox -s windows``):
the SDK's ``oarbank_sdk.winjob`` (a kill-on-close job object, no breakaway, per op, daemon
and runner; a process started suspended, assigned, resumed: one binding for the agent and the
conformance kit) and ``handover.py`` (a connection's pipe pair,
duplicated into the service's daemon and into the job process the connect names once that pid
is in the attempt's job object, else ``bad_pid``), ``streams.py`` (the agent's overlapped
pipe ends behind the broker's readiness calls); the control plane: ``loops.py`` (the proactor
loop), ``endpoint.py`` with ``pipeserver.py`` and ``controlpipe.py`` (the control pipe:
every instance under a protected DACL from its creation, its random name recorded in
``<state>/control.sock``, the client checking the pipe's owner), ``statedir.py``
(``LockFileEx`` on ``agent.lock``), ``requests.py`` (Ctrl-C and Ctrl-Break stop; reload is
the ``reload`` command) and ``sessions.py`` (a new process group in a job object of its own);
the process side: ``groups.py`` (``Groups``: a named kill-on-close job object per group, the
leader started suspended and placed by ``Slot.started``, containment ``job-object``) with
``jobgroup.py`` (one group: its members, Ctrl-Break then ``TerminateJobObject``),
``jobapi.py``, ``jobwatch.py`` (one completion port: a group's end and its memory-limit
hits) and ``limits.py`` (``memory.max``/``cpu.max`` as a job memory limit and a CPU rate
cap; Wine enforces neither, ``limit_gaps`` says so), ``proctable.py`` (psutil),
``factoryhost.py`` (no factory) and ``sandboxhost.py`` (the walls: job UI and process-count
limits enforced, no AppContainer or restricted token launcher, so the sandbox is
unavailable).

What it does not have (each said where it shows): no sandbox launcher (no AppContainer or
restricted token yet: ``--sandbox auto`` runs children unconfined and names the missing walls,
``required`` refuses), no process factory (Windows has no fork), no ``--keep-services`` (no
keeper socket, no service manager). The state dir is this user's by its owner's SID and a
protected DACL (``privatedir.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oarbank_agent.platform.api import Backend

__all__ = ["backend"]


def backend() -> Backend:
    # Imported here: every module of the package imports on any system (the agent's tests
    # import them all), but only Windows makes the parts.
    from oarbank_agent.platform.api import Backend
    from oarbank_agent.platform.windows.endpoint import PipeEndpoint
    from oarbank_agent.platform.windows.factoryhost import WindowsFactoryHost
    from oarbank_agent.platform.windows.groups import WindowsGroups
    from oarbank_agent.platform.windows.handover import DuplicatingHandovers
    from oarbank_agent.platform.windows.loops import ProactorLoops
    from oarbank_agent.platform.windows.nudges import EventNudges
    from oarbank_agent.platform.windows.requests import ConsoleRequests
    from oarbank_agent.platform.windows.sandboxhost import WindowsSandboxHost
    from oarbank_agent.platform.windows.sessions import WindowsSessions
    from oarbank_agent.platform.windows.statedir import WindowsStateDir
    from oarbank_agent.platform.windows.streams import WindowsStreams

    return Backend(name="windows", sessions=WindowsSessions(), sandbox=WindowsSandboxHost(),
                   # the control plane and the agent's I/O: overlapped pipes on the proactor
                   streams=WindowsStreams(), endpoint=PipeEndpoint(),
                   statedir=WindowsStateDir(), requests=ConsoleRequests(),
                   loops=ProactorLoops(), factory=WindowsFactoryHost(),
                   # job objects: a kill-on-close one per group, nested in the agent's own
                   groups=WindowsGroups(),
                   # connections: each end duplicated into its process (no keeper, no systemd)
                   handovers=DuplicatingHandovers(),
                   # runner control: an inherited auto-reset event per attempt
                   nudges=EventNudges())
