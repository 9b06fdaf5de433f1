"""Test-only fault injection: ``OARBANK_AGENT_FAULT`` breaks one behaviour of the agent on
purpose, so that an outside check (the harness's scenarios) can prove it fails when that
behaviour is broken. Read only by ``oarbank-agent run`` from its own environment (children
never see it: they get exact environments). It can never be on silently: the agent logs a
warning at start, and ``status`` shows it (``"fault"``; the table prints a FAULT line). An
unknown value refuses to start (exit 2). Like the sandbox's ``OARBANK_SANDBOX_FAULT``.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["ENV", "KEEP_PREDECESSOR_GROUPS", "NO_IDLE_STOP", "FLAT_BACKOFF", "BARE_START_ERRORS",
           "CHARGE_RELEASED", "NO_DEMAND_EVICTION", "FAULTS", "from_env", "describe"]

ENV = "OARBANK_AGENT_FAULT"
KEEP_PREDECESSOR_GROUPS = "keep_predecessor_groups"
NO_IDLE_STOP = "no_idle_stop"
FLAT_BACKOFF = "flat_backoff"
BARE_START_ERRORS = "bare_start_errors"
CHARGE_RELEASED = "charge_released"
NO_DEMAND_EVICTION = "no_demand_eviction"
FAULTS = {
    KEEP_PREDECESSOR_GROUPS: "restart recovery does not end the previous agent's process "
                             "groups: they keep running",
    NO_IDLE_STOP: "idle services are never stopped (the idle timeout never fires)",
    FLAT_BACKOFF: "a failed service waits backoff_initial_s before every restart (the delay "
                  "never grows)",
    BARE_START_ERRORS: "a failed start is recorded as 'start failed', without the module's "
                       "own reason (its stderr)",
    CHARGE_RELEASED: "an attempt released by host protection is counted against the job "
                     "(charged) like a failed one",
    NO_DEMAND_EVICTION: "no idle service is stopped to make room for a job memory holds back "
                        "(it waits for the idle timeout)",
}


def from_env(env: Mapping[str, str]) -> str | None:
    """The fault asked for, or None. Raises ValueError naming the known ones."""
    value = env.get(ENV, "").strip()
    if not value:
        return None
    if value not in FAULTS:
        raise ValueError(f"{ENV}={value!r} is not a known fault (test-only fault injection; "
                         f"known: {', '.join(FAULTS)})")
    return value


def describe(fault: str) -> str:
    return f"FAULT INJECTED (test only): {ENV}={fault}: {FAULTS[fault]}"
