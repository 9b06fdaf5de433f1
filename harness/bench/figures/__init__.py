"""The seven figures. Each ``run(bench) -> {"title", "metrics": {name: metric}, "details"}``."""

from __future__ import annotations

from . import asgi, connect, footprint, overhead, readiness, requests, warm

__all__ = ["FIGURES"]

# key in results.json -> module; run in this order (footprint's idle window wants the bench
# service up and nothing running, which the two before it leave behind).
FIGURES = {
    "request_path": requests,
    "connect_handoff": connect,
    "readiness": readiness,
    "footprint": footprint,
    "job_overhead": overhead,
    "warm_vs_per_job_load": warm,
    "asgi_path": asgi,  # its own agent and module: after the others, which share one
}
