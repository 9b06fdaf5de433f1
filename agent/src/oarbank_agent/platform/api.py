"""The platform interface: what every backend gives the rest of the agent, and nothing more.

One ``Backend`` per process (``platform.current()``), made of parts, each a small protocol
below. A part says what it does in the agent's words (a group is ended, a request to stop
arrives), never how an OS does it; a port writes its backend and touches nothing else.

Parts (each section below): process groups (``Groups``, ``Group``), memory and CPU limits,
the sandbox wrapper and its probe, the control endpoint, the state-dir lock, stop and reload
requests, the event loop, the stream type behind the transport.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Backend"]


@dataclass(frozen=True)
class Backend:
    """The chosen backend: its name and its parts (fields added per part, one section each)."""

    name: str
