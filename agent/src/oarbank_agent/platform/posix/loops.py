"""The event loop on POSIX: asyncio's default, a selector loop (readiness, signal handlers).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["SelectorLoops"]

T = TypeVar("T")


class SelectorLoops:
    """``api.Loops``: what ``asyncio`` makes by default on POSIX (``SelectorEventLoop``)."""

    def new(self) -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(main)
