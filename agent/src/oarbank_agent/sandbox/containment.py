"""Containment: how far the end of a group reaches (``oarbank-agent run --containment``).

Why: a process group is only a convention. A runner's child that calls ``setsid()`` leaves it
and would outlive the attempt. Where the platform backend can hold a group more firmly
(``platform/linux/containment.py``), ending the group ends what left it too.

Modes (``MODES``):

- ``auto`` (default): the firmer hold when usable here, else process groups only, with the
  reason in ``status`` (``containment``, ``containment_note``).
- the firmer hold only: refuse to start the agent when it cannot be had
  (``ContainmentUnavailable``).
- ``process-group``: process groups only (what every platform without more gets).

This module is the agent's side: the modes and the one containment in use, which the backend
keeps (``install`` once at start, before anything is spawned; ``current``). Every group
``procs.spawn`` starts and ``procs.retire_group`` ends goes through it.
"""

from __future__ import annotations

from pathlib import Path

from oarbank_agent import platform
from oarbank_agent.platform.api import CONTAINMENT_MODES as MODES
from oarbank_agent.platform.api import Containment, ContainmentUnavailable

__all__ = ["MODES", "Containment", "ContainmentUnavailable", "resolve", "install", "current"]


def resolve(mode: str, state_dir: Path) -> Containment:
    """The containment for ``mode`` on this machine. Raises ``ContainmentUnavailable``
    (the firmer hold asked for, not usable) or ``ValueError`` (unknown mode)."""
    return platform.current().groups.resolve(mode, state_dir)


def install(box: Containment) -> None:
    """Make ``box`` the one every group is spawned into and ended with (once, at start)."""
    platform.current().groups.install(box)


def current() -> Containment:
    return platform.current().groups.containment
