"""Small helpers the scenarios share: reading rows, results and load counts."""

from __future__ import annotations

from typing import Any

from harness.e2e.scenario import Ctx
from harness.nodes.backends.base import Node

__all__ = ["FAST", "row", "portal_row", "loads", "service_pids", "wait_row", "wait_portal",
           "submit_all", "submit_all_watching"]

FAST = "dev.oarbank.e2e.fastmodel"


def row(node: Node, module: str, service: str) -> dict[str, Any]:
    r = node.service_row(module, service)
    if r is None:
        raise AssertionError(f"{node.node_id}: status --json has no row for {module}/{service}")
    return r


def wait_row(ctx: Ctx, node: Node, module: str, service: str, what: str,
             pred: Any, timeout_s: float) -> dict[str, Any]:
    """Wait until the node's status row satisfies `pred`; the row."""
    def probe() -> dict[str, Any] | None:
        r = node.service_row(module, service)
        return r if r is not None and pred(r) else None

    try:
        return ctx.wait_for(f"{node.node_id} {service} row: {what}", probe, timeout_s)
    except AssertionError as exc:
        raise type(exc)(f"{exc}; row now {node.service_row(module, service)}")


def portal_row(ctx: Ctx, module: str, node: Node, service: str) -> dict[str, Any] | None:
    return ctx.portal.row(module, node.node_id, service)


def wait_portal(ctx: Ctx, module: str, node: Node, service: str, what: str, pred: Any,
                timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until the portal's `services` row for the node satisfies `pred` (heartbeats are
    posted on every state change, so this is quick)."""
    def probe() -> dict[str, Any] | None:
        r = portal_row(ctx, module, node, service)
        return r if r is not None and pred(r) else None

    try:
        return ctx.wait_for(f"portal row of {node.node_id}/{service}: {what}", probe, timeout_s)
    except AssertionError as exc:
        raise type(exc)(f"{exc}; portal row now {portal_row(ctx, module, node, service)}")


def loads(node: Node) -> list[str]:
    """The example's load record: one line (the loading pid) per model load."""
    return node.read_lines("model.loads")


def service_pids(record: dict[str, Any]) -> list[int]:
    """The service pids a modelserver job saw (its result's provenance)."""
    result = record.get("result") or {}
    return list((result.get("provenance") or {}).get("service_pids") or [])


def submit_all(node: Node, module: str, stage: str, payloads: list[Any],
               timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Submit every payload at once (`submit --wait` each, in parallel); the final records,
    results included, in payload order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(payloads))) as pool:
        futs = [pool.submit(node.submit, module, stage, p, wait=True, timeout_s=timeout_s)
                for p in payloads]
        return [f.result() for f in futs]


def submit_all_watching(node: Node, module: str, stage: str, payloads: list[Any],
                        look: Any, every_s: float, timeout_s: float = 120.0
                        ) -> list[dict[str, Any]]:
    """``submit_all`` while ``look()`` is called every ``every_s`` seconds in a thread, from
    before the first submit until the last job is final (what it sees is its own to keep)."""
    import threading

    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            look()
            stop.wait(every_s)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        return submit_all(node, module, stage, payloads, timeout_s)
    finally:
        stop.set()
        watcher.join(10)
