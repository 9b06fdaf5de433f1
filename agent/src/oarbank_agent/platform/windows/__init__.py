"""The Windows backend: its parts are written and tested under Wine, the whole is not yet,
so the agent refuses to start on Windows and says so.

Written (each tested with Windows' own CPython under Wine, ``nox -s windows``):
``jobobjects.py`` (a kill-on-close job object, no breakaway, per op, daemon and runner; a
process started suspended, assigned, resumed) and ``handover.py`` (a connection's pipe pair,
duplicated into the service's daemon and into the job process the connect names once that pid
is in the attempt's job object, else ``bad_pid``), ``controlpipe.py`` (the control pipe's
instances under a protected DACL: the agent's user, administrators, SYSTEM). Still to write,
the rest of ``api.Backend``: the control pipe's serving loop, ``LockFileEx`` for the state
dir, control commands for stop and reload, the proactor loop, the process table, the
sandbox's walls.
"""

from __future__ import annotations

from typing import NoReturn

from oarbank_agent.platform.choice import BackendUnavailable

__all__ = ["backend"]


def backend() -> NoReturn:
    raise BackendUnavailable(
        "the agent has no complete Windows backend yet (oarbank_agent/platform/windows/): job "
        "objects and pipe-handle handovers are written, the control pipe, the state-dir lock, "
        "stop and reload requests and the event loop are not; the SDK's job and service sides "
        "do run on Windows")
