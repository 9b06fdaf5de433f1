"""Heartbeat documents and request headers the portal tests share (a module of its own name:
``conftest`` is a name every test folder has, so importing it is ambiguous across folders)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["MODULE_ID", "auth", "heartbeat", "service_row"]

MODULE_ID = "dev.example.modelserver"


def service_row(**over: Any) -> dict[str, Any]:
    row = {"module": MODULE_ID, "service": "model", "health": "healthy", "running": True,
           "ready": True, "accepting": True, "error": None, "held": None, "disabled": False,
           "withdrawn": False, "gpu_api_missing": False, "lifecycle": "on_demand", "users": 0,
           "endpoint": True}
    row.update(over)
    return row


def heartbeat(node_id: str, *rows: dict[str, Any], hostname: str | None = None,
              t: float | None = None) -> dict[str, Any]:
    return {"node_id": node_id, "hostname": hostname or f"host-{node_id}",
            "time": time.time() if t is None else t, "services": list(rows)}


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
