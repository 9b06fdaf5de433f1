"""The platform interface's parts for keeping services across an agent restart
(``--keep-services``): the keeper's socket and the system's service manager.

Re-exported by ``api.py``, whose ``Backend`` holds one of each where the system has them.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["KeeperHost", "ServiceManager"]


# -- the keeper of endpoint channels (--keep-services) ------------------------------------------


class KeeperHost(Protocol):
    """The keeper's socket (``oarbank_agent/keep``): reachable by its owner's user only, the
    peer's user said by the system, a channel's end passed along with a message."""

    def listen(self, path: Path) -> socket.socket:
        """A listening socket at ``path``, reachable by this user only from the start."""

    def connect(self, path: Path, timeout: float) -> socket.socket | None:
        """A connection to the keeper at ``path``; None when none answers there."""

    def peer_uid(self, sock: socket.socket) -> int | None:
        """The user of the process at the other end, as the system says (None: unknown)."""

    def send(self, sock: socket.socket, doc: dict[str, Any], fds: tuple[int, ...] = ()) -> None:
        """One message: ``doc``, and a duplicate of each of ``fds``."""

    def recv(self, sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
        """One message and the descriptors that came with it (the caller's to close);
        ConnectionError at its end."""

    def peer_gone(self, end: socket.socket) -> bool:
        """The other side of a held end closed it (looked at without reading)."""

    def started(self, pid: int) -> int | None:
        """When ``pid`` started, as the system counts it; None where it cannot say."""


class ServiceManager(Protocol):
    """The system's service manager, where one runs the agent (systemd's notify protocol and
    descriptor store): told when the agent is ready, it keeps descriptors across a restart
    of the agent's unit and hands them back at the next start."""

    def active(self) -> bool:
        """Whether a service manager runs this agent and listens to it."""

    def notify(self, fields: Mapping[str, str], fds: tuple[int, ...] = ()) -> bool:
        """Tell it ``fields`` (with ``fds``); False when there is none."""

    def handed_back(self) -> list[tuple[str, int]]:
        """(name, fd) of each descriptor it handed back at this start (taken once)."""

    def store_bytes(self, name: str, data: bytes) -> int:
        """A descriptor holding ``data``, to be stored with it."""

    def read_stored(self, fd: int, limit: int = 1 << 20) -> bytes:
        """What such a descriptor holds."""
