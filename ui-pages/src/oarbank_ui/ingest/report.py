"""A checked report as the store takes it (``Report``), what became of it (``Outcome``), and
the digest that tells a whole report that says nothing new (``report_digest``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .validate import Heartbeat, StillAlive, parse_heartbeat

__all__ = ["Outcome", "Report", "report_digest"]


def report_digest(doc: dict[str, Any]) -> str:
    """The digest of a decoded full report, all but its ``time`` (keys sorted)."""
    rest = {k: v for k, v in doc.items() if k != "time"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


@dataclass(frozen=True)
class Report:
    """One node's report, checked and ready to store."""

    what: Heartbeat | StillAlive
    # the full report's own digest, or the one a still-alive names; None: kept as none (a
    # report stored in-process, ``HeartbeatStore.record``: no still-alive may name it)
    digest: str | None
    received_at: float
    token_hash: str | None = None  # None: no token check (in-process callers, tests)
    # A whole report whose digest this portal stored before: ``what`` is its StillAlive
    # (validate.parse_unchanged) and this its document, parsed only if the store no longer
    # holds that digest (another portal stored something newer, the node was removed).
    whole: dict[str, Any] | None = None

    @property
    def node_id(self) -> str:
        return self.what.node_id

    @property
    def short(self) -> bool:
        """Whether the node sent a short still-alive (not its whole report)."""
        return isinstance(self.what, StillAlive) and self.whole is None

    def heartbeat(self) -> Heartbeat:
        """The whole report (parsed now if it stood as unchanged)."""
        if isinstance(self.what, Heartbeat):
            return self.what
        assert self.whole is not None, "a short still-alive has no whole report"
        return parse_heartbeat(self.whole)


@dataclass(frozen=True)
class Outcome:
    # applied | not_applied | revoked | send_full; the group commit adds overloaded,
    # store_error and expired
    status: str
    reason: str = ""
    digest: str | None = None  # applied: what a still-alive may name next

    @property
    def applied(self) -> bool:
        return self.status == "applied"
