"""Nudges on Windows (runner protocol, Control): one auto-reset event per attempt, which its
runner inherits, the handle's number in ``OARBANK_CONTROL_EVENT`` (upstream's way).

The agent keeps the event's first handle, never inheritable, and sets it after each change;
the runner gets a duplicate, inheritable for its spawn only (the spawn passes just the handles
it names) and closed here once the runner runs. Waiting on an auto-reset event resets it, so
changes made while the runner works between safe points add up to one nudge, which is all a
nudge says (read the document again).
"""

from __future__ import annotations

from typing import Any

from oarbank_sdk.control import ENV_CONTROL_EVENT

__all__ = ["EventNudges"]


def _win() -> tuple[Any, Any]:
    import _overlapped  # type: ignore[import-not-found,unused-ignore]  # Windows only
    import _winapi  # type: ignore[import-not-found,unused-ignore]

    return _overlapped, _winapi


class _EventNudge:
    def __init__(self) -> None:
        overlapped, winapi = _win()
        # auto-reset, not set, no name: nobody can open it but by a handle
        self._event: int | None = overlapped.CreateEvent(None, False, False, None)
        me = winapi.GetCurrentProcess()
        try:
            self._child: int | None = winapi.DuplicateHandle(
                me, self._event, me, 0, True, winapi.DUPLICATE_SAME_ACCESS)
        except OSError:
            winapi.CloseHandle(self._event)
            raise
        self.env = {ENV_CONTROL_EVENT: str(self._child)}
        self.inherit: tuple[int, ...] = (self._child,)

    def spawned(self) -> None:
        """The runner holds its own copy now (or never started): ours for it goes."""
        if self._child is not None:
            _win()[1].CloseHandle(self._child)
            self._child = None

    def nudge(self, leader: int) -> bool:
        del leader  # the event is the runner's alone
        if self._event is None:
            return False
        _win()[0].SetEvent(self._event)
        return True

    def close(self) -> None:
        self.spawned()
        if self._event is not None:
            _win()[1].CloseHandle(self._event)
            self._event = None


class EventNudges:
    how = "an inherited auto-reset event"

    def prepare(self) -> None:
        pass  # a child that never waits on its event is not touched by it

    def for_runner(self) -> _EventNudge:
        return _EventNudge()
