"""A job's record as the jobs endpoints (contract 10.3) and the ``jobs`` host query (10.8) show
it: the store's row, its JSON columns read back."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["job_view"]

_JOB_FIELDS = ("job_id", "batch_id", "module", "stage", "state", "submitted_at", "started_at",
               "finished_at", "node_id", "attempt_id", "generation", "placement",
               "lease_expiries", "expires_at")


def _loads(text: Any) -> Any:
    return None if text is None else json.loads(text)


def job_view(r: dict[str, Any], *, full: bool = True) -> dict[str, Any]:
    out = {k: r.get(k) for k in _JOB_FIELDS}
    out["grants"] = r.get("generation")
    if full:
        out["payload"] = _loads(r.get("payload"))
        out["record"] = _loads(r.get("record"))
        out["result"] = _loads(r.get("result"))
    return out
