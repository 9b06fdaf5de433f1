"""Stop and reload requests on POSIX: signals (SIGTERM and SIGINT stop, SIGHUP reloads).

The handlers run on the event loop (``loop.add_signal_handler``: the loop's self-pipe wakes
it), so a request is handled between two callbacks, never inside one. A second stop request
calls ``on_stop`` again: the agent then hurries its drain.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

__all__ = ["SignalRequests"]


class SignalRequests:
    """``api.Requests`` as signals."""

    stop_how = "SIGTERM"  # SIGINT (Ctrl-C) too
    reload_how = "SIGHUP"

    def install(self, loop: asyncio.AbstractEventLoop, on_stop: Callable[[str], None],
                on_reload: Callable[[str], None]) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, on_reload, signal.SIGHUP.name)
