"""The Windows backend: not written yet, so the agent refuses to start and says so.

The shape it will fill (``api.Backend``): job objects for groups, named-pipe-free handle
duplication for streams, a control pipe with an owner-only DACL, ``LockFileEx`` for the
state dir, control commands instead of signals, the proactor loop.
"""

from __future__ import annotations

from typing import NoReturn

from oarbank_agent.platform.choice import BackendUnavailable

__all__ = ["backend"]


def backend() -> NoReturn:
    raise BackendUnavailable(
        "the agent has no Windows backend yet (oarbank_agent/platform/windows.py): process "
        "groups as job objects, pipe-handle streams, the control pipe and the state-dir lock "
        "are still to be written; the SDK's job and service sides do run on Windows")
