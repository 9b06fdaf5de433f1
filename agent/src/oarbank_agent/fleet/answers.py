"""The portal's answers to a node's claims, renews and results (contract 10.4-10.7) read, and
what the node does about each: pure, no I/O, no clock.

- A claim's grants: each checked whole; one that is not a grant (a field missing or of the
  wrong kind) is named and skipped, the others run. Its lease then ends on the portal, which
  queues the job again.
- A renew's ``lost``: the attempts to stop at once, with the portal's reason.
- A result's answer: ``accepted`` (200), ``refused`` (409: ``lease_lost``,
  ``stale_generation``, ``cancelled``, ``not_your_attempt``; or 400 / 413: the same body would
  be refused again) or ``retry`` (anything else: 503, a token being fixed, the portal away),
  with the same body. A release's answer reads the same: ``accepted`` is the job queued again
  on the portal; ``refused``, the attempt no longer this node's (``job_done`` too: it ended).
- Backoff: doubling from ``BACKOFF_FIRST_S`` to ``BACKOFF_MAX_S``, each wait stretched by up
  to half again at random, so nodes refused together do not come back together.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

__all__ = ["BACKOFF_FIRST_S", "BACKOFF_MAX_S", "Grant", "Verdict", "backoff",
           "carried_verdicts", "error_of", "read_grants", "read_lost", "result_verdict"]

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
REFUSALS = ("lease_lost", "stale_generation", "cancelled", "not_your_attempt", "job_done")


@dataclass(frozen=True)
class Grant:
    attempt_id: int
    job_id: str
    generation: int
    module: str
    stage: str
    payload: dict[str, Any]
    placement: str | None = None
    expires_at: float | None = None

    def portal(self) -> dict[str, Any]:
        """What the local job record keeps of it (``JobRecord.portal``)."""
        return {"job_id": self.job_id, "attempt_id": self.attempt_id,
                "generation": self.generation, "placement": self.placement, "report": None}


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _grant(g: Any, i: int) -> Grant | str:
    where = f"grants[{i}]"
    if not isinstance(g, dict):
        return f"{where}: not an object"
    for key in ("attempt_id", "generation"):
        if not _whole(g.get(key)):
            return f"{where}.{key}: not a whole number >= 1 ({g.get(key)!r})"
    for key in ("job_id", "module", "stage"):
        if not isinstance(g.get(key), str) or not g[key]:
            return f"{where}.{key}: not text ({g.get(key)!r})"
    if not isinstance(g.get("payload"), dict):
        return f"{where}.payload: not an object"
    exp = g.get("expires_at")
    placement = g.get("placement")
    return Grant(g["attempt_id"], g["job_id"], g["generation"], g["module"], g["stage"],
                 g["payload"], placement if isinstance(placement, str) else None,
                 float(exp) if isinstance(exp, (int, float)) and not isinstance(exp, bool)
                 else None)


def read_grants(doc: Any) -> tuple[list[Grant], list[str], float | None]:
    """A claim's answer: its grants, the problems of those skipped, and ``renew_s`` (None
    when it gave none)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("grants"), list):
        return [], ["the answer has no grants list"], None
    grants, problems = [], []
    for i, g in enumerate(doc["grants"]):
        got = _grant(g, i)
        if isinstance(got, str):
            problems.append(got)
        else:
            grants.append(got)
    renew = doc.get("renew_s")
    renew_s = (float(renew) if isinstance(renew, (int, float)) and not isinstance(renew, bool)
               and renew > 0 else None)
    return grants, problems, renew_s


def read_lost(doc: Any) -> dict[int, str]:
    """A renew's answer: attempt id -> why the node must stop it."""
    lost = doc.get("lost") if isinstance(doc, dict) else None
    out = {}
    for x in lost if isinstance(lost, list) else []:
        if isinstance(x, dict) and _whole(x.get("attempt_id")):
            out[x["attempt_id"]] = str(x.get("error") or "lease_lost")
    return out


def error_of(body: bytes) -> str:
    """The portal's ``error`` (and ``detail``), or the start of the body."""
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        detail = doc.get("detail")
        return doc["error"] + (f": {detail}" if isinstance(detail, str) and detail else "")
    return body[:200].decode("utf-8", "replace").strip() or "(no body)"


@dataclass(frozen=True)
class Verdict:
    outcome: str  # accepted | refused | retry
    why: str = ""


def result_verdict(status: int, body: bytes) -> Verdict:
    """What an answer to ``POST /v1/agent/result`` (or ``/release``) means for the node."""
    if status == 200:
        return Verdict("accepted")
    why = error_of(body)
    if status == 409:
        code = why.split(":", 1)[0]
        return Verdict("refused", code if code in REFUSALS else why)
    if status in (400, 413):
        return Verdict("refused", f"HTTP {status}: {why}")
    return Verdict("retry", f"HTTP {status}: {why}")


def carried_verdicts(doc: Any, n: int) -> list[Verdict] | None:
    """What a claim's answer says of the ``n`` results it carried (``results``, in the order
    sent, each as ``POST /v1/agent/result`` would answer it); None when it says nothing of
    them (a portal that does not take results with claims ignores the key)."""
    items = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(items, list) or len(items) != n:
        return None
    out = []
    for item in items:
        status = item.get("status") if isinstance(item, dict) else None
        if isinstance(status, int) and not isinstance(status, bool):
            out.append(result_verdict(status, json.dumps(item).encode()))
        else:
            out.append(Verdict("retry", f"the claim's answer for it is not one: {item!r:.100}"))
    return out


def backoff(previous: float | None, rng: random.Random) -> tuple[float, float]:
    """(the wait now, with jitter; the next step's base) after a failure."""
    base = BACKOFF_FIRST_S if previous is None else min(previous * 2, BACKOFF_MAX_S)
    return base * (1.0 + 0.5 * rng.random()), base
