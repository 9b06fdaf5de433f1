"""What confining a child means on macOS: the SDK's launcher under Seatbelt
(``sandbox-exec``), which has no finer walls to measure; the agent cannot be made undumpable
(macOS has no ``PR_SET_DUMPABLE``; only root or the same user may inspect it).

On Linux (the test profile) Seatbelt does not exist: the sandbox is reported unavailable with
that reason, never emulated by Linux walls."""

from __future__ import annotations

import sys

from oarbank_sdk import sandbox

__all__ = ["DarwinSandboxHost"]


class DarwinSandboxHost:
    endpoint_walls: tuple[str, ...] = ("macos_seatbelt",)
    required_walls: tuple[str, ...] = ("macos_seatbelt",)
    extra_walls: tuple[str, ...] = ()

    def unavailable_reason(self) -> str | None:
        if sys.platform != "darwin":
            return "sandbox-exec is macOS only (this is the darwin profile on Linux)"
        if sandbox.available():
            return None
        return "unavailable: macos_seatbelt (sandbox-exec could not confine the probe)"

    def set_undumpable(self) -> bool:
        return False

    def undumpable(self) -> bool:
        return False

    def walls(self) -> dict[str, str]:
        return {}  # the SDK's launcher measures them (``sandbox.capabilities``)

    def kernel_note(self) -> str | None:
        return None
