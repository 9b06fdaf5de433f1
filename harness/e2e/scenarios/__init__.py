"""The scenarios; importing this package registers them (harness.e2e.scenario.SCENARIOS)."""

from __future__ import annotations

from harness.e2e.scenarios import (
    agent_restart,
    agent_upgrade,
    crash_loop,
    evict_for_job,
    fleet_dispatch,
    gpu_real,
    gpu_shared_start,
    idle_stop,
    listener_refused,
    oom_limit,
    yield_,
)

__all__ = ["agent_restart", "agent_upgrade", "crash_loop", "evict_for_job", "fleet_dispatch",
           "gpu_real",
           "gpu_shared_start", "idle_stop", "listener_refused", "oom_limit", "yield_"]
