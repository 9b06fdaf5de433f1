"""How much each figure runs: the full bench and ``--quick`` (same keys, fewer rounds)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Params", "FULL", "QUICK", "REPO", "MODELSERVER"]

REPO = Path(__file__).resolve().parents[2]
MODELSERVER = REPO / "examples" / "modelserver"


@dataclass(frozen=True)
class Params:
    # 1. warm vs per-job load
    warm_jobs: int
    warm_load_s: float
    warm_rounds: int
    # 2. request path (per round: one attempt; <= 60 connects, under the 64 burst)
    req_rounds: int
    req_per_request: int
    req_keepalive: int
    req_naive_keepalive: int
    # 3. connect handoff
    connect_parallel: tuple[int, ...]
    connect_count: int
    connect_rounds: int
    # 4. readiness
    ready_rounds: int
    ready_load_s: float
    # 5. footprint
    idle_s: float
    hold_attempts: int
    hold_s: float
    # 6. job overhead
    trivial_jobs: int
    trivial_rounds: int
    single_rounds: int
    # 7. ASGI path (per round: one attempt; connect + per_request + 8 <= 64, the burst)
    asgi_rounds: int
    asgi_connect: int
    asgi_per_request: int
    asgi_keepalive: int
    asgi_stream: int


WARM_TOKENS = 4  # prompts per job

FULL = Params(warm_jobs=20, warm_load_s=2.0, warm_rounds=2,
              req_rounds=6, req_per_request=50, req_keepalive=300, req_naive_keepalive=25,
              connect_parallel=(1, 8, 32), connect_count=40, connect_rounds=2,
              ready_rounds=8, ready_load_s=0.2,
              idle_s=10.0, hold_attempts=64, hold_s=3.0,
              trivial_jobs=60, trivial_rounds=2, single_rounds=20,
              asgi_rounds=8, asgi_connect=25, asgi_per_request=30, asgi_keepalive=300,
              asgi_stream=50)

QUICK = Params(warm_jobs=8, warm_load_s=0.5, warm_rounds=1,
               req_rounds=2, req_per_request=30, req_keepalive=100, req_naive_keepalive=10,
               connect_parallel=(1, 8, 32), connect_count=10, connect_rounds=1,
               ready_rounds=2, ready_load_s=0.2,
               idle_s=2.0, hold_attempts=16, hold_s=1.0,
               trivial_jobs=20, trivial_rounds=1, single_rounds=5,
               asgi_rounds=2, asgi_connect=10, asgi_per_request=20, asgi_keepalive=100,
               asgi_stream=20)
