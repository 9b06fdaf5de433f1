"""A service's row in a heartbeat (contract section 6), defined once: the agent builds it
(``Supervisor.row``) and the portal reads it back (``oarbank_ui.ingest.validate``).

``as_dict`` is the row as it goes over the wire, its keys in this order. ``raw`` is only set
by a reader: the row exactly as it arrived, keys this SDK does not know included (a newer agent
may report more); it is never sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

__all__ = ["ServiceRow", "FIELDS", "BOOL_FIELDS"]


@dataclass(frozen=True)
class ServiceRow:
    module: str
    service: str
    health: str | None
    running: bool
    ready: bool
    accepting: bool
    error: str | None
    held: str | None
    disabled: bool
    withdrawn: bool
    gpu_api_missing: bool
    lifecycle: str
    users: int
    endpoint: bool
    raw: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The row for a heartbeat: every field but ``raw``."""
        return {name: getattr(self, name) for name in FIELDS}


# The wire keys, in order, and those that are true or false.
FIELDS = tuple(f.name for f in fields(ServiceRow) if f.name != "raw")
BOOL_FIELDS = ("running", "ready", "accepting", "disabled", "withdrawn", "gpu_api_missing",
               "endpoint")
