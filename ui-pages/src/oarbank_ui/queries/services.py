"""The ``services`` host query's decisions (contract section 6), free of storage.

``state`` and ``stopped_reason`` are derived from one stored row; the store calls these so the
rule lives in exactly one place.

Liveness (contract 6.3): a node that sent nothing for ``STALE_PERIODS`` of its own heartbeat
periods is stale, judged by when the portal *received* its last report (the node's clock may be
wrong; the portal's is the one all nodes share). Its rows answer ``unknown``. A node whose agent
said it was stopping (its last report) answers ``stopped`` / ``agent stopped`` instead: it is
not missing, it left.
"""

from __future__ import annotations

import json
import time
from typing import Any

__all__ = ["AGENT_STOPPED", "COLUMNS", "MAX_ROWS", "STALE_PERIODS", "QueryError", "derive_state",
           "derive_stopped_reason", "is_stale", "iso_utc", "services_row", "was_evicted"]

STALE_PERIODS = 3
AGENT_STOPPED = "agent stopped"

MAX_ROWS = 200
# Exactly the contract's columns, in its order.
COLUMNS = ("node_id", "hostname", "service", "health", "state", "stopped_reason", "error",
           "gpu_api_missing", "lifecycle", "users", "endpoint", "reported_at")


class QueryError(ValueError):
    """A query that cannot be answered (unknown query, bad parameter); the message says why."""


def derive_state(running: bool, ready: bool) -> str:
    """``ready`` = running and ready; ``starting`` = running, not yet ready; else ``stopped``."""
    if running:
        return "ready" if ready else "starting"
    return "stopped"


def derive_stopped_reason(*, running: bool, held: str | None, disabled: bool, withdrawn: bool,
                          gpu_api_missing: bool, evicted: bool = False) -> str | None:
    """Null while running; otherwise the first that applies, in the contract's priority.
    ``evicted`` (this implementation's addition, before the catch-all ``idle``): the agent
    stopped the idle service to make room for a job (its row's ``evicted_for``)."""
    if running:
        return None
    if held:
        return f"held: {held}"
    if disabled:
        return "disabled"
    if withdrawn:
        return "withdrawn"
    if gpu_api_missing:
        return "gpu api missing"
    return "evicted" if evicted else "idle"


def was_evicted(raw: str | None) -> bool:
    """Whether a stored row (its ``raw`` JSON, as the agent sent it) names the job it was
    evicted for."""
    if not raw or '"evicted_for"' not in raw:
        return False
    try:
        return bool(json.loads(raw).get("evicted_for"))
    except (ValueError, AttributeError):
        return False


def iso_utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def is_stale(received_at: float, heartbeat_s: float, now: float) -> bool:
    return now - received_at > STALE_PERIODS * heartbeat_s


def services_row(stored: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """One query row from one stored row (booleans as stored 0/1 are turned back into bools).
    ``now`` (the portal's clock) decides liveness; None: liveness not judged."""
    running = bool(stored["running"])
    row = _row(stored, running)
    if stored.get("agent_stopped"):
        row.update(state="stopped", stopped_reason=AGENT_STOPPED, users=0)
    elif (now is not None and "received_at" in stored
          and is_stale(stored["received_at"], stored["heartbeat_s"], now)):
        row.update(state="unknown", stopped_reason="node not reporting (last report "
                                                   f"{iso_utc(stored['received_at'])})")
    return row


def _row(stored: dict[str, Any], running: bool) -> dict[str, Any]:
    return {
        "node_id": stored["node_id"],
        "hostname": stored["hostname"],
        "service": stored["service"],
        "health": stored["health"],
        "state": derive_state(running, bool(stored["ready"])),
        "stopped_reason": derive_stopped_reason(
            running=running,
            held=stored["held"],
            disabled=bool(stored["disabled"]),
            withdrawn=bool(stored["withdrawn"]),
            gpu_api_missing=bool(stored["gpu_api_missing"]),
            evicted=not running and was_evicted(stored.get("raw")),
        ),
        "error": stored["error"],
        "gpu_api_missing": bool(stored["gpu_api_missing"]),
        "lifecycle": stored["lifecycle"],
        "users": stored["users"],
        "endpoint": bool(stored["endpoint"]),
        "reported_at": stored["reported_at"],
    }
