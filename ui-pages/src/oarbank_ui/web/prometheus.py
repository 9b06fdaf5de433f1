"""``GET /metrics``: the portal's figures in the Prometheus text format (prometheus_client).

Counters and the latency histogram live in this process; the fleet's figures (nodes by
liveness, service rows by module, state and stopped reason) are read from the store at scrape
time, by a collector, so every replica behind one database answers the same fleet.
Each portal gets its own registry: tests start several in one process, and nothing here
leaks into the default global one. With ``--workers N`` (several processes on one socket) the
counters and the histogram are prometheus_client's multiprocess ones
(``PROMETHEUS_MULTIPROC_DIR``, set by the CLI before this module is imported): a scrape, which
any worker may answer, sums every worker's figures.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "PortalMetrics", "REFUSAL_CAUSES"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Why a report was refused (the ``cause`` label; the agent logs the same words).
REFUSAL_CAUSES = ("host", "content_type", "unauthenticated", "wrong_node", "malformed",
                  "too_large", "truncated", "read_timeout", "store_error", "overloaded",
                  "alive_unknown")


class _FleetCollector(Collector):
    def __init__(self, summary: Callable[[], dict[str, Any]],
                 queue: Callable[[], dict[tuple[str, str], int]] | None = None) -> None:
        self._summary = summary
        self._queue = queue

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if self._queue is not None:
            depth = GaugeMetricFamily("oarbank_portal_dispatch_jobs", "Dispatched jobs queued "
                                      "or running, by module (the queue depth is state=queued)",
                                      labels=["module", "state"])
            for (module, state), n in sorted(self._queue().items()):
                depth.add_metric([module, state], n)
            yield depth
        s = self._summary()
        nodes = GaugeMetricFamily("oarbank_portal_nodes", "Nodes known to the store, by "
                                  "liveness (reporting, stale, stopped)", labels=["liveness"])
        for k, v in sorted(s["nodes"].items()):
            nodes.add_metric([k], v)
        yield nodes
        rows = GaugeMetricFamily("oarbank_portal_services", "Service rows by module, state and "
                                 "stopped reason", labels=["module", "state", "stopped_reason"])
        for (module, state, reason), v in sorted(s["services"].items()):
            rows.add_metric([module, state, reason], v)
        yield rows


class PortalMetrics:
    def __init__(self, summary: Callable[[], dict[str, Any]],
                 queue: Callable[[], dict[tuple[str, str], int]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        own: CollectorRegistry | None = self.registry
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            from prometheus_client import multiprocess

            # the figures live in files every worker writes; a scrape reads them all
            multiprocess.MultiProcessCollector(self.registry)
            own = None
        self.accepted = Counter("oarbank_portal_reports_accepted", "Reports stored",
                                registry=own)
        self.not_applied = Counter("oarbank_portal_reports_not_applied", "Reports accepted but "
                                   "older than the node's stored one", registry=own)
        self.still_alive = Counter("oarbank_portal_reports_still_alive", "Reports stored that "
                                   "were a short still-alive (no rows sent)", registry=own)
        self.refused = Counter("oarbank_portal_reports_refused", "Reports refused, by cause",
                               ["cause"], registry=own)
        for cause in REFUSAL_CAUSES:
            self.refused.labels(cause)  # every cause shows, at 0, before it first happens
        self.latency = Histogram("oarbank_portal_request_seconds", "Time to answer a request, "
                                 "by route", ["route"], registry=own,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        # the group commit (store/group_commit.py): how old its queue is (the highest of the live
        # workers'), and how many batches and reports it committed
        self.queue_age = Gauge("oarbank_portal_ingest_queue_age_seconds", "How long the oldest "
                               "report not yet committed has waited (after each batch)",
                               registry=own, multiprocess_mode="livemax")
        self.batches = Counter("oarbank_portal_ingest_batches", "Transactions of the group "
                               "commit", registry=own)
        self.batched = Counter("oarbank_portal_ingest_batched_reports", "Reports committed by "
                               "the group commit (over batches: reports per transaction)",
                               registry=own)
        # fleet dispatch (dispatch/http.py); this process's counts
        self.submitted = Counter("oarbank_portal_dispatch_submitted", "Jobs submitted",
                                 registry=own)
        self.grants = Counter("oarbank_portal_dispatch_grants", "Jobs granted to nodes, by "
                              "placement (ready, starting, cold)", ["placement"], registry=own)
        self.cold_starts = Counter("oarbank_portal_dispatch_cold_starts", "Grants that start a "
                                   "cold copy of a service", registry=own)
        self.lease_expiries = Counter("oarbank_portal_dispatch_lease_expiries", "Leases that "
                                      "expired: their jobs were queued again", registry=own)
        self.results = Counter("oarbank_portal_dispatch_results", "Results accepted, by state",
                               ["state"], registry=own)
        self.results_refused = Counter("oarbank_portal_dispatch_results_refused", "Results "
                                       "refused, by error (lease_lost, stale_generation, ...)",
                                       ["error"], registry=own)
        self.claim_batches = Counter("oarbank_portal_dispatch_claim_transactions", "Transactions"
                                     " of the claims' group commit", registry=own)
        self.claims_batched = Counter("oarbank_portal_dispatch_claims", "Claims written by the"
                                      " group commit (over transactions: claims per"
                                      " transaction)", registry=own)
        for placement in ("ready", "starting", "cold"):
            self.grants.labels(placement)
        for state in ("succeeded", "failed"):
            self.results.labels(state)
        for error in ("lease_lost", "stale_generation", "cancelled", "not_your_attempt"):
            self.results_refused.labels(error)
        self._routes: dict[str, Any] = {}  # the histogram's child per route
        self.registry.register(_FleetCollector(summary, queue))

    def batch_done(self, reports: int, seconds: float, queue_age: float) -> None:
        self.batches.inc()
        self.batched.inc(reports)
        self.queue_age.set(queue_age)

    def claims_done(self, claims: int) -> None:
        self.claim_batches.inc()
        self.claims_batched.inc(claims)

    def observe(self, route: str, started: float) -> None:
        child = self._routes.get(route)
        if child is None:  # labels() takes a lock and builds a key: once per route
            child = self._routes[route] = self.latency.labels(route)
        child.observe(time.perf_counter() - started)

    def render(self) -> bytes:
        return generate_latest(self.registry)
