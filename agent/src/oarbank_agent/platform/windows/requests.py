"""Stop and reload requests on Windows: Ctrl-C and Ctrl-Break stop; reload is the control
endpoint's ``reload`` command only (``oarbank-agent reload``), as stop is also ``drain``.

Windows has no SIGTERM or SIGHUP to send a process; a console's Ctrl-C and Ctrl-Break
reach a process as SIGINT and SIGBREAK (a process started in a new process group gets only
Ctrl-Break: ``sessions.ask_to_stop`` sends it). The proactor loop has no
``add_signal_handler``, so the handlers are ``signal.signal``'s: they run in the main thread
between two bytecodes (the loop's wakeup socket ends its wait) and only hand the request to
the loop (``call_soon_threadsafe``), so it is handled between two callbacks, never inside
one. A second stop request calls ``on_stop`` again: the agent then hurries its drain.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

__all__ = ["ConsoleRequests", "STOP_SIGNALS"]

_signal: Any = signal  # SIGBREAK: Windows only
STOP_SIGNALS = ("SIGINT", "SIGBREAK")


class ConsoleRequests:
    """``api.Requests`` as console control events."""

    stop_how = "Ctrl-Break"  # Ctrl-C too
    reload_how = "`oarbank-agent reload`"

    def install(self, loop: asyncio.AbstractEventLoop, on_stop: Callable[[str], None],
                on_reload: Callable[[str], None]) -> None:
        for name in STOP_SIGNALS:
            def handler(signum: int, frame: object, name: str = name) -> None:
                loop.call_soon_threadsafe(on_stop, name)

            signal.signal(getattr(_signal, name), handler)
