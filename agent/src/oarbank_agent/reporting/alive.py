"""What the next heartbeat says: the whole snapshot, or a short "still alive"; and how long a
portal that answered ``Retry-After`` is left alone. Pure decisions, no I/O (heartbeat.py
posts).

Still alive: a portal that understands it answers a stored report with ``alive`` (a digest
of what it stored). While the node's report is the same as that one, all but its ``time``,
the next post may be ``{node_id, hostname, time, heartbeat_s, alive}`` only: the portal keeps
the node fresh without rewriting its rows. The whole snapshot goes when anything changed, at
least every ``full_every`` posts, after any post that failed or was refused, and when the
portal answers that it does not hold the named report (409). Figures that drift on every
report (the node's memory, each service's resident memory) do not count as new: they go with
the whole snapshot at least every ``full_every`` posts (a minute at the default period; the
portal's history keeps 5-minute buckets), a change of state at once. A portal that never answers
``alive`` (an older one) only ever gets whole snapshots.

Retry-After (a 503 or 429 from an overloaded portal): the node waits that long plus up to
half again at random, so refused nodes do not come back together; the post after that is the
whole snapshot, built anew.
"""

from __future__ import annotations

import json
import random
from typing import Any

__all__ = ["AliveState", "retry_after_s"]

MAX_RETRY_AFTER_S = 3600.0
_DRIFTING = ("time", "metrics")
_DRIFTING_ROW = ("rss_bytes",)


def retry_after_s(value: str | None, rng: random.Random | None = None) -> float | None:
    """The wait a ``Retry-After`` header asks for, with jitter; None when there is none or it
    is not delta-seconds (an HTTP date from some proxy: the ordinary backoff then)."""
    if value is None or not value.strip().isdigit():
        return None
    base = min(float(value.strip()), MAX_RETRY_AFTER_S)
    return base * (1.0 + 0.5 * (rng or random).random())


class AliveState:
    def __init__(self, full_every: int = 6) -> None:
        if full_every < 1:
            raise ValueError(f"full_every must be >= 1, got {full_every}")
        self.full_every = full_every
        self._digest: str | None = None  # what the portal said it holds
        self._held: str | None = None  # that report, as this node sent it, without its time
        self._sent: str | None = None  # the report of the post in flight
        self._short_in_a_row = 0
        self.last_was_short = False

    @staticmethod
    def _key(doc: dict[str, Any]) -> str:
        """The report as far as "something new" goes: no time, no drifting figures."""
        rest = {k: v for k, v in doc.items() if k not in _DRIFTING}
        rows = rest.get("services")
        if isinstance(rows, list):
            rest["services"] = [{k: v for k, v in r.items() if k not in _DRIFTING_ROW}
                                if isinstance(r, dict) else r for r in rows]
        return json.dumps(rest, sort_keys=True)

    def body(self, doc: dict[str, Any]) -> dict[str, Any]:
        """The document to post for the node's current report ``doc``."""
        key = self._key(doc)
        self._sent = key
        short = (self._digest is not None and key == self._held
                 and self._short_in_a_row < self.full_every - 1)
        self.last_was_short = short
        if not short:
            return doc
        return {"node_id": doc.get("node_id"), "hostname": doc.get("hostname"),
                "time": doc.get("time"), "heartbeat_s": doc.get("heartbeat_s"),
                "alive": self._digest}

    def answered(self, reply: Any) -> None:
        """The portal stored the post: remember the digest it offers, if any."""
        digest = reply.get("alive") if isinstance(reply, dict) else None
        if self.last_was_short:
            self._short_in_a_row += 1
        else:
            self._short_in_a_row = 0
            self._held = self._sent if isinstance(digest, str) else None
            self._digest = digest if isinstance(digest, str) else None

    def forget(self) -> None:
        """A post failed or was refused: the next one is the whole snapshot."""
        self._digest = self._held = None
        self._short_in_a_row = 0
        self.last_was_short = False
