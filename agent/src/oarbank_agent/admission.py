"""FIFO token admission (pure): which waiting jobs may take their pool tokens now.

Rules:
- A job asks for ``requires.pools`` tokens (``{pool_key: n}``) and may name ``needs_pools``
  (the pool must exist on this node, i.e. have a capacity above zero; no token is taken).
- Jobs are considered in submission order. A job that cannot get all its tokens waits, and
  no later job may take a token of a pool an earlier waiting job is waiting for (no
  overtaking), while jobs on other pools still go ahead.
- Tokens are held until ``release``; capacities come from fingerprints and may change (a
  withdrawn service's pools count 0); a lowered capacity never takes tokens back, it only
  stops new admissions.

Pool keys are ``"<module id>/<pool>"``: two modules may both name a pool ``model``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["Request", "Admission"]


@dataclass(frozen=True)
class Request:
    job_id: str
    pools: dict[str, int] = field(default_factory=dict)  # pool key -> tokens
    needs: tuple[str, ...] = ()  # pool keys that must exist


class Admission:
    def __init__(self) -> None:
        self.capacity: dict[str, int] = {}
        self.in_use: dict[str, int] = {}
        self._queue: OrderedDict[str, Request] = OrderedDict()
        self._holding: dict[str, Request] = {}

    # --- inputs ---------------------------------------------------------------------------

    def set_capacity(self, pool_key: str, n: int) -> None:
        self.capacity[pool_key] = max(0, int(n))

    def enqueue(self, req: Request) -> None:
        self._queue[req.job_id] = req

    def cancel(self, job_id: str) -> bool:
        """Drop a waiting request (never admitted). True if it was waiting."""
        return self._queue.pop(job_id, None) is not None

    def release(self, job_id: str) -> dict[str, int]:
        """Give back the tokens a job holds; returns them."""
        req = self._holding.pop(job_id, None)
        if req is None:
            return {}
        for pool, n in req.pools.items():
            self.in_use[pool] = self.in_use.get(pool, 0) - n
        return dict(req.pools)

    # --- the decision ---------------------------------------------------------------------

    def admit(self) -> list[Request]:
        """Admit every job that may go now, in order; their tokens are taken."""
        admitted: list[Request] = []
        blocked: set[str] = set()
        for job_id, req in list(self._queue.items()):
            pools = set(req.pools) | set(req.needs)
            if pools & blocked:
                blocked |= pools  # waits behind an earlier job: its pools block later ones too
                continue
            if self._fits(req):
                for pool, n in req.pools.items():
                    self.in_use[pool] = self.in_use.get(pool, 0) + n
                del self._queue[job_id]
                self._holding[job_id] = req
                admitted.append(req)
            else:
                blocked |= pools
        return admitted

    def _fits(self, req: Request) -> bool:
        for pool in req.needs:
            if self.capacity.get(pool, 0) <= 0:
                return False
        for pool, n in req.pools.items():
            if self.capacity.get(pool, 0) - self.in_use.get(pool, 0) < n:
                return False
        return True

    # --- views ----------------------------------------------------------------------------

    def waiting(self) -> list[str]:
        return list(self._queue)

    def holders(self, pool_key: str) -> int:
        """How many admitted jobs hold at least one token of ``pool_key``."""
        return sum(1 for r in self._holding.values() if r.pools.get(pool_key, 0) > 0)
