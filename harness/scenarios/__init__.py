"""The scenarios; importing this package registers them (harness.scenario.SCENARIOS)."""

from __future__ import annotations

from harness.scenarios import agent_restart, crash_loop, idle_stop, listener_refused

__all__ = ["agent_restart", "crash_loop", "idle_stop", "listener_refused"]
