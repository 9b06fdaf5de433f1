"""The Windows backend: its parts are written and tested under Wine, the whole is not yet,
so the agent refuses to start on Windows and says so.

Written (each tested with Windows' own CPython under Wine, ``nox -s windows``):
``jobobjects.py`` (a kill-on-close job object, no breakaway, per op, daemon and runner; a
process started suspended, assigned, resumed) and ``handover.py`` (a connection's pipe pair,
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

Still missing, so ``backend()`` refuses: the assembly of these parts into ``api.Backend``
and, outside this package, a state dir ``operate/statedir.py`` can prepare here (it calls
``os.geteuid``, ``O_NOFOLLOW``, ``os.pread`` and ``os.fchmod``, which Windows' Python lacks,
and a folder's ACL, not its mode, keeps others out here).
"""

from __future__ import annotations

from typing import NoReturn

from oarbank_agent.platform.choice import BackendUnavailable

__all__ = ["backend"]


def backend() -> NoReturn:
    raise BackendUnavailable(
        "the agent has no complete Windows backend yet (oarbank_agent/platform/windows/): job "
        "objects, pipe-handle handovers, the broker's pipe streams, the control pipe, the "
        "state-dir lock, stop and reload requests, sessions and the event loop are written; "
        "process groups on job objects (with the process table), the process factory's host "
        "side and the sandbox's walls are not, nor a state dir prepared the Windows way; the "
        "SDK's job and service sides do run on Windows")
