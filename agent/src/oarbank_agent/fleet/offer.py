"""What a claim says the node can take now (contract 10.4), and whether to claim at all: pure,
no I/O, no clock (``snapshot.py`` reads the agent into these views).

Rules:

- A service's pool offers its **free** tokens: its capacity now, less the tokens admitted
  jobs hold, less those the node's own waiting jobs ask for (local ``submit`` and earlier
  grants alike: a token promised here is not offered twice).
- **Room** (``max_grants``): the free tokens of every pool whose service could serve a job
  now: one ``ready`` or ``starting``, or one ``stopped`` whose ``mem_gb`` fits in the free
  memory plus what demand eviction could free (unknown figures fit). A stage that reserves no
  pool takes one job at a time, and only while no job of the node waits.
- No room, or the agent stopping: no claim. The node claims again when something changes.
- ``job_s``: the mean run time of the module's last ``JOB_TIMES_KEPT`` successful attempts
  on this node; null before the first.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JOB_TIMES_KEPT", "JobTimes", "ModuleView", "NodeView", "ServiceView", "claim_body",
           "claim_bytes", "room"]

JOB_TIMES_KEPT = 50
MAX_GRANTS = 1000  # the portal's bound (contract 10.4)


@dataclass(frozen=True)
class ServiceView:
    service: str
    state: str  # ready | starting | stopped
    pools: dict[str, tuple[int, int]]  # pool -> (free, total)
    load_s: float | None  # measured start to ready, None: never measured
    mem_gb: float | None  # what its start reserves, None: nothing


@dataclass(frozen=True)
class ModuleView:
    module: str
    stages: tuple[str, ...]
    services: tuple[ServiceView, ...] = ()
    job_s: float | None = None
    poolless_stages: tuple[str, ...] = ()  # of ``stages``: those that reserve no pool


@dataclass(frozen=True)
class NodeView:
    node_id: str
    modules: tuple[ModuleView, ...] = ()
    free_mem_gb: float | None = None
    evictable_mem_gb: float | None = None
    gpus: tuple[dict[str, Any], ...] = ()
    waiting: int = 0  # the node's jobs waiting for admission (any origin)
    stopping: bool = False


def _fits(svc: ServiceView, node: NodeView) -> bool:
    if svc.state in ("ready", "starting") or svc.mem_gb is None:
        return True
    if node.free_mem_gb is None:
        return True
    return svc.mem_gb <= node.free_mem_gb + (node.evictable_mem_gb or 0.0) + 1e-9


def room(node: NodeView) -> int:
    """How many grants to ask for now (0: do not claim)."""
    if node.stopping:
        return 0
    n = 0
    for mod in node.modules:
        for svc in mod.services:
            if _fits(svc, node):
                n += sum(free for free, _total in svc.pools.values())
        if mod.poolless_stages and node.waiting == 0:
            n += 1
    return min(n, MAX_GRANTS)


def _num(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def claim_body(node: NodeView, wait_s: float, max_grants: int) -> dict[str, Any]:
    """The claim (contract 10.4)."""
    return {"node_id": node.node_id, "wait_s": wait_s, "max_grants": max_grants,
            "free_mem_gb": _num(node.free_mem_gb),
            "evictable_mem_gb": _num(node.evictable_mem_gb), "gpus": list(node.gpus),
            "modules": [{"module": m.module, "stages": list(m.stages),
                         "services": [{"service": s.service, "state": s.state,
                                       "pools": {p: {"free": f, "total": t}
                                                 for p, (f, t) in s.pools.items()},
                                       "load_s": _num(s.load_s), "job_s": _num(m.job_s),
                                       "mem_gb": _num(s.mem_gb)} for s in m.services]}
                        for m in node.modules]}


def claim_bytes(claim: dict[str, Any], results: list[bytes]) -> bytes:
    """The claim's body, carrying ``results`` (each a result's body, 10.7) as they are."""
    body = json.dumps(claim, separators=(",", ":")).encode()
    if not results:
        return body
    return body[:-1] + b',"results":[' + b",".join(results) + b"]}"


@dataclass
class JobTimes:
    """Per module, the run times of its last successful attempts on this node."""

    kept: int = JOB_TIMES_KEPT
    _by_module: dict[str, deque[float]] = field(default_factory=dict)

    def add(self, module: str, seconds: float) -> None:
        if seconds >= 0:
            self._by_module.setdefault(module, deque(maxlen=self.kept)).append(seconds)

    def mean(self, module: str) -> float | None:
        times = self._by_module.get(module)
        return sum(times) / len(times) if times else None
