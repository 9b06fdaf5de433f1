"""The agent's process factory, as the rest of the agent sees it: whether there is one
(``--process-factory``), the installed client, its report for ``status``.

The factory itself (one warm helper that forks every child) is the Linux backend's
(``platform/linux/factory/``: a fork server needs ``fork`` and the Linux sandbox); the backend
makes its client (``platform.current().factory.client``). ``procs.spawn`` uses the installed
client and starts children directly when there is none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from oarbank_agent.platform.api import FactoryLost

if TYPE_CHECKING:
    from oarbank_agent.platform.linux.factory.client import FactoryClient

__all__ = ["MODES", "FactoryLost", "install", "current", "resolve_mode", "report"]


MODES = ("on", "off")

_current: FactoryClient | None = None
_note = "off: not installed (children are started directly)"


def resolve_mode(mode: str, platform: str) -> tuple[bool, str]:
    """(use the factory, why): ``on`` works on Linux only (fork + the Linux sandbox).

    ``platform``: the backend's name (``platform.current().name``), so the darwin profile on
    Linux has no factory, as a Mac has none."""
    if mode not in MODES:
        raise ValueError(f"unknown --process-factory {mode!r} (one of: {', '.join(MODES)})")
    if mode == "off":
        return False, "off (--process-factory off): every child is started directly"
    if not platform.startswith("linux"):
        return False, f"off: the process factory needs Linux (this is {platform})"
    return True, "on: children are forked by the agent's process factory"


def install(client: FactoryClient | None, note: str = "") -> None:
    """Make ``client`` the one ``procs.spawn`` uses (None: start children directly;
    ``note``: why, for ``status``)."""
    global _current, _note
    _current = client
    _note = note or _note


def report() -> dict[str, object]:
    """``status``' ``process_factory``: on/off and why; when on its pid, resident memory and
    descriptors (the agent's footprint is the agent's and this), restarts."""
    if _current is None:
        return {"mode": "off", "note": _note}
    return _current.footprint()


def current() -> FactoryClient | None:
    return _current
