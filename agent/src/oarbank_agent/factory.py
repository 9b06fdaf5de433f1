"""The agent's process factory: one warm helper that starts every child of the agent.

``client`` (the agent's side, asyncio) asks ``server`` (the factory process) for a child;
``child`` is what the forked child does until it execs or runs its script in place; ``plan``
holds the pure decisions (the sandbox launcher's argv, running ``python -I`` in place);
``wire`` the messages; ``selfconfine`` the factory's own walls.

``procs.spawn`` uses the installed client (``install``/``current``; ``--process-factory``),
and starts children directly when there is none. Kept free of imports: the factory process
imports this package too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oarbank_agent.factory.client import FactoryClient

__all__ = ["MODES", "install", "current", "resolve_mode", "report"]

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
