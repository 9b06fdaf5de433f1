"""The event loop on Windows: asyncio's proactor loop (overlapped I/O on pipes and sockets,
``create_subprocess_exec``; no readiness callbacks, no signal handlers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["ProactorLoops"]

T = TypeVar("T")


class ProactorLoops:
    """``api.Loops``: ``ProactorEventLoop``, named rather than left to the default policy."""

    def new(self) -> asyncio.AbstractEventLoop:
        windows: Any = asyncio  # ProactorEventLoop: Windows only
        loop: asyncio.AbstractEventLoop = windows.ProactorEventLoop()
        return loop

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        with asyncio.Runner(loop_factory=self.new) as runner:
            return runner.run(main)
