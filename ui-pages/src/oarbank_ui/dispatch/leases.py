"""Fencing: whether a node's word about an attempt (renew, result, release) still counts.
Pure: the store reads the attempt and its job, ``fence`` judges (contract 10.6, 10.7).

An attempt counts while it is its job's live grant: ``running`` on the portal's clock, this
node's, and of the generation the node names. Once its lease expired (or it was released,
cancelled, or the job granted again), nothing the node says about it changes the job: so no
job completes twice.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Attempt", "fence", "refusal_detail"]


@dataclass(frozen=True)
class Attempt:
    node_id: str
    generation: int
    state: str  # running, succeeded, failed, expired, released, cancelled
    expires_at: float
    job_generation: int  # the job's grants so far


def fence(a: Attempt | None, node_id: str, generation: int, now: float) -> str | None:
    """None: the attempt is live and the node's; ``done``: it already ended with a result
    (a replay); otherwise the refusal's code."""
    if a is None or a.node_id != node_id:
        return "not_your_attempt"
    if a.generation != generation or a.job_generation < a.generation:
        return "stale_generation"
    if a.state in ("succeeded", "failed"):
        return "done"
    if a.state == "cancelled":
        return "cancelled"
    if a.state == "running" and a.expires_at >= now:
        return None
    # expired (or about to be marked so), released: a later grant makes it stale
    return "stale_generation" if a.job_generation > a.generation else "lease_lost"


def refusal_detail(code: str, attempt_id: int) -> str:
    """The words of a refusal (``fence``'s code) for the node's log."""
    return {
        "not_your_attempt": f"attempt {attempt_id} is not this node's",
        "stale_generation": f"attempt {attempt_id} is of an earlier generation: its job was "
                            "granted again",
        "lease_lost": f"the lease of attempt {attempt_id} expired; its job went back to the queue",
        "cancelled": f"the job of attempt {attempt_id} was cancelled",
        "job_done": f"attempt {attempt_id} already ended with a result",
    }.get(code, code)
