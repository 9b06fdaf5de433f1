"""The bounded history behind ``node_metrics`` (SQLite and PostgreSQL alike): what the writer
folds each report into, and the roll-up that keeps it bounded.

Every stored report adds to one sample per node, module, service and time bucket
(``node_samples``): ``fine_s`` wide (default 5 min) while it is young, holding the bucket's
latest state, its highest users, resident memory and node memory. Samples older than
``fine_keep_s`` (default 6 h) are rolled up into ``coarse_s`` buckets (default 1 h; a coarse
bucket was ``ready`` if the service was ready in any of its samples), and samples older than
``retention_s`` (default 7 days, ``oarbank-portal serve --metrics-retention-h``) are deleted.
So a node costs at most ``fine_keep_s / fine_s + retention_s / coarse_s`` samples per service
(72 + 168 with the defaults) whatever its heartbeat period. The roll-up runs at most once a
``compact_every_s`` per process, after a report's write, and is idempotent (each coarse
bucket is rolled once, when all of it is older than ``fine_keep_s``): replicas may race.
The queries that read it are ``queries/nodes.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ingest.validate import Heartbeat, service_metrics

__all__ = ["History", "SAMPLE_INSERT", "compact_samples", "sample_conflict", "sample_values"]


@dataclass(frozen=True)
class History:
    """How much history the portal keeps, and how finely."""

    fine_s: int = 300
    fine_keep_s: int = 6 * 3600
    coarse_s: int = 3600
    retention_s: int = 7 * 86400
    compact_every_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.fine_s <= self.coarse_s or self.coarse_s % self.fine_s:
            raise ValueError("history: coarse_s must be a multiple of fine_s")
        if self.retention_s < self.coarse_s:
            raise ValueError(f"history: retention must be at least {self.coarse_s} s")


def _floor(kind: str, expr: str, size: int) -> str:
    if kind == "sqlite":
        return f"(CAST(({expr}) / {size} AS INTEGER) * {size})"
    return f"(floor(({expr}) / {size}) * {size})"


def _greatest(kind: str, a: str, b: str) -> str:
    return f"max({a}, {b})" if kind == "sqlite" else f"GREATEST({a}, {b})"


SAMPLE_INSERT = ("INSERT INTO node_samples (module, node_id, service, res_s, t, hostname,"
                  " running, ready, users, rss_bytes, loads, mem_used_bytes,"
                  " mem_reserved_bytes, gpu_mem_used_bytes, samples)")


def sample_conflict(kind: str) -> str:
    """How a sample folds into its bucket's: the latest state, the highest figures."""
    g = lambda c: _greatest(kind, f"node_samples.{c}", f"excluded.{c}")  # noqa: E731
    return (" ON CONFLICT (module, node_id, service, res_s, t) DO UPDATE SET"
            " hostname = excluded.hostname, running = excluded.running,"
            f" ready = excluded.ready, users = {g('users')},"
            f" rss_bytes = COALESCE({g('rss_bytes')}, excluded.rss_bytes),"
            " loads = excluded.loads,"
            f" mem_used_bytes = COALESCE({g('mem_used_bytes')}, excluded.mem_used_bytes),"
            " mem_reserved_bytes = excluded.mem_reserved_bytes,"
            f" gpu_mem_used_bytes = COALESCE({g('gpu_mem_used_bytes')},"
            " excluded.gpu_mem_used_bytes), samples = node_samples.samples + 1")


def sample_values(hb: Heartbeat, now: float, h: History) -> list[tuple[Any, ...]]:
    """A report's samples for its fine bucket: SAMPLE_INSERT's values but ``samples`` (1)."""
    bucket = float(int(now // h.fine_s) * h.fine_s)
    m = hb.metrics or {}
    stopped = hb.agent_stopped
    return [
        (r.module, hb.node_id, r.service, h.fine_s, bucket, hb.hostname,
         int(r.running and not stopped), int(r.ready and r.running and not stopped),
         0 if stopped else r.users, *service_metrics(r).values(), m.get("mem_used_bytes"),
         m.get("mem_reserved_bytes"), m.get("gpu_mem_used_bytes"))
        for r in hb.services]


def compact_samples(tx: Any, kind: str, now: float, h: History,
            modules: list[str] | None = None) -> dict[str, int]:
    """Roll fine samples whose coarse bucket has aged past ``fine_keep_s`` into it, and drop
    samples past ``retention_s``. Counts of what went.

    ``modules`` (the ones this process has seen reported; None: every module, read from the
    table) bound the work to index ranges: with them only the last two hours before the edge
    are rolled (what aged since the previous run, once a minute), without them everything
    before it (a process's first run, after a portal was down for a while)."""
    edge = float(int((now - h.fine_keep_s) // h.coarse_s) * h.coarse_s)
    full = modules is None
    if modules is None:
        modules = [r["module"] for r in tx.all("SELECT DISTINCT module FROM node_samples")]
    low = -1.0 if full else edge - 2 * h.coarse_s
    ct = _floor(kind, "t", h.coarse_s)
    rolled = dropped = 0
    for module in modules:  # each a range of the (module, t, ...) index
        args = (module, low, edge, h.fine_s)
        tx.run("INSERT INTO node_samples (module, node_id, service, res_s, t, hostname,"
               " running, ready, users, rss_bytes, loads, mem_used_bytes, mem_reserved_bytes,"
               " gpu_mem_used_bytes, samples)"
               f" SELECT module, node_id, service, {h.coarse_s}, {ct}, MAX(hostname),"
               " MAX(running), MAX(ready), MAX(users), MAX(rss_bytes), MAX(loads),"
               " MAX(mem_used_bytes), MAX(mem_reserved_bytes), MAX(gpu_mem_used_bytes),"
               " SUM(samples) FROM node_samples WHERE module = ? AND t >= ? AND t < ?"
               f" AND res_s = ? GROUP BY module, node_id, service, {ct}"
               " ON CONFLICT (module, node_id, service, res_s, t) DO NOTHING", args)
        rolled += tx.run("DELETE FROM node_samples WHERE module = ? AND t >= ? AND t < ?"
                         " AND res_s = ?", args)
        dropped += tx.run("DELETE FROM node_samples WHERE module = ? AND t < ?",
                          (module, now - h.retention_s))
    return {"rolled": rolled, "dropped": dropped}


