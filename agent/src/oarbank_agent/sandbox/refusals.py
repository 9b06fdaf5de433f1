"""Every network attempt of a confined child, counted per service and per attempt.

Each sandboxed launch (``procs.spawn`` with a ``refusal_key``) gets the launcher's
``--notify-fd``: the sandbox's filter sends ``socket``, ``bind``, ``listen``, ``connect`` and
``accept`` of the child and of everything it starts to the agent, which records who tried
what and answers EPERM, as the plain filter would (``oarbank_sdk.sandbox.notify_session``). It runs
on the agent's event loop (the backend's readiness watcher), no thread per launch. Nothing the child writes
is read.

``Refusals`` (one per agent, ``install``/``current``) keeps, per key (``<module>/<service>``
for every op and daemon of a service, ``<job id>.<n>`` for an attempt's runner and its
children): the count, the first and the last attempt (``socket(AF_INET) by pid 12 (python:
python -I svc.py serve)``). ``status`` shows them as ``sandbox_refusals``; a service row whose
``error`` is set says how many attempts were refused and the last one.

Without user notification (not Linux, sandbox off, a kernel without it) launches are not
watched: the filter still refuses every call, the agent just does not count them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from oarbank_agent import platform
from oarbank_sdk.protocol import current_transport

__all__ = ["Refusals", "Watch", "install", "current"]

log = logging.getLogger("oarbank_agent.sandbox.refusals")


@dataclass
class _Tally:
    count: int
    first: str
    last: str


class Refusals:
    """What the agent counted since it started."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled  # launches get a watch
        self._by_key: dict[str, _Tally] = {}
        self._watches: set[Watch] = set()

    def record(self, key: str, attempt: Any) -> None:
        text = str(attempt)
        t = self._by_key.get(key)
        if t is None:
            self._by_key[key] = _Tally(1, text, text)
        else:
            t.count += 1
            t.last = text
        log.warning("%s: the sandbox refused %s", key, text)

    def get(self, key: str) -> dict[str, Any] | None:
        t = self._by_key.get(key)
        return None if t is None else {"count": t.count, "first": t.first, "last": t.last}

    def report(self) -> dict[str, dict[str, Any]]:
        """``{key: {count, first, last}}`` for every key with at least one refusal."""
        return {k: {"count": t.count, "first": t.first, "last": t.last}
                for k, t in sorted(self._by_key.items())}

    def describe(self, key: str) -> str | None:
        """One clause for an error line, or None."""
        t = self._by_key.get(key)
        if t is None:
            return None
        return f"the sandbox refused {t.count} network attempt(s), the last: {t.last}"

    def watch(self, key: str) -> Watch | None:
        """A watch for one launch, or None when launches are not watched here."""
        if not self.enabled:
            return None
        w = Watch(self, key)
        self._watches.add(w)
        return w

    def forget(self, w: Watch) -> None:
        self._watches.discard(w)

    def close(self) -> None:
        for w in list(self._watches):
            w.close()


class Watch:
    """One launch's watch on the running loop: ``child_fd`` to the launcher (inherited, and
    ``--notify-fd``), ``spawned()`` once the launcher runs (or failed to start). It closes
    itself when no process uses the filter any more."""

    def __init__(self, owner: Refusals, key: str) -> None:
        from oarbank_sdk import sandbox

        self._owner, self.key = owner, key
        self._loop = asyncio.get_running_loop()
        self._io = platform.current().streams.watcher(self._loop)
        self._sock, theirs = current_transport().pair()
        self._sock.setblocking(False)
        self.child_fd: int | None = theirs.detach()
        self._session = sandbox.notify_session(self._sock, lambda a: owner.record(key, a))
        self._listener: int | None = None
        self._closed = False
        self._io.on_readable(self._sock.fileno(), self._on_sock)

    def spawned(self) -> None:
        if self.child_fd is not None:
            import os

            os.close(self.child_fd)
            self.child_fd = None

    def _on_sock(self) -> None:
        try:
            more = self._session.on_sock()
        except (OSError, RuntimeError, ValueError) as exc:
            log.error("%s: the launcher's hand-over failed: %s", self.key, exc)
            self.close()
            return
        if self._listener is None and self._session.listener is not None:
            self._listener = self._session.listener
            self._io.on_readable(self._listener, self._on_listener)
        if not more:
            self._io.off_readable(self._sock.fileno())
            if self._session.listener is None:
                self.close()  # the launcher never handed a listener over: nothing to watch

    def _on_listener(self) -> None:
        try:
            more = self._session.on_listener()
        except OSError as exc:
            log.error("%s: the seccomp listener failed: %s", self.key, exc)
            more = False
        if not more:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.spawned()
        with contextlib.suppress(Exception):
            self._io.off_readable(self._sock.fileno())
        if self._listener is not None:
            with contextlib.suppress(Exception):
                self._io.off_readable(self._listener)
        self._session.close()
        self._sock.close()
        self._owner.forget(self)


_current: Refusals = Refusals(enabled=False)


def install(enforced: bool) -> Refusals:
    """At start: watch launches when the sandbox enforces on the Linux backend (user
    notification is part of every kernel the sandbox needs: seccomp filters with NEW_LISTENER,
    5.0+; macOS, and the darwin profile, have none)."""
    global _current
    _current = Refusals(enabled=enforced and platform.current().name == "linux")
    return _current


def current() -> Refusals:
    return _current
