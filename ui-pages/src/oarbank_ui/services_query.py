"""The ``services`` host query's decisions (contract section 6), free of storage.

``state`` and ``stopped_reason`` are derived from one stored row; the store calls these so the
rule lives in exactly one place.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COLUMNS", "MAX_ROWS", "QueryError", "derive_state", "derive_stopped_reason",
           "services_row"]

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
                          gpu_api_missing: bool) -> str | None:
    """Null while running; otherwise the first that applies, in the contract's priority."""
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
    return "idle"


def services_row(stored: dict[str, Any]) -> dict[str, Any]:
    """One query row from one stored row (booleans as stored 0/1 are turned back into bools)."""
    running = bool(stored["running"])
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
        ),
        "error": stored["error"],
        "gpu_api_missing": bool(stored["gpu_api_missing"]),
        "lifecycle": stored["lifecycle"],
        "users": stored["users"],
        "endpoint": bool(stored["endpoint"]),
        "reported_at": stored["reported_at"],
    }
