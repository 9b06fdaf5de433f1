"""Watching a ready service for a failure of its own: an endpoint service closing its channel,
its group dying (no live member left; ``Group.wait_gone``), or, for a service that left
nothing in its start group (it runs elsewhere) and has no channel, its `status` op asked
sparsely (``detachedwatch.py``). Says why it failed; what is done about it is the driver's.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from oarbank_agent import procs
from oarbank_agent.modules.loaded import NodeInfo
from oarbank_agent.sandbox import escapewatch
from oarbank_agent.services import detachedwatch, ops
from oarbank_agent.services.runtime import ServiceRuntime
from oarbank_agent.services.states import LOGGER

if TYPE_CHECKING:
    from oarbank_agent.broker.channel import Channel

__all__ = ["ReadyWatch"]

log = logging.getLogger(LOGGER)


class ReadyWatch:
    def __init__(self, node: NodeInfo, registry: procs.ProcessRegistry, *,
                 status_poll_s: float) -> None:
        self.node = node
        self.registry = registry
        # First interval of the sparse `status` polls (detachedwatch; --status-poll-s).
        self.status_poll_s = status_poll_s

    async def until_failed(self, rt: ServiceRuntime, ch: Channel | None) -> str | None:
        """Wait until ``rt`` (ready, on channel ``ch`` if any) fails on its own and say why;
        None at once when nothing of it can be watched. Cancelled when the agent stops it."""
        waits: set[asyncio.Future[Any]] = set()
        if ch is not None:
            waits.add(ch.closed)
        watched = rt.group
        group: asyncio.Task[None] | None = None
        status: asyncio.Task[str] | None = None
        if watched is not None and watched.members():
            group = asyncio.create_task(watched.wait_gone(), name=f"group {watched}")
            waits.add(group)
        elif ch is None:
            log.info("%s: nothing of it is left in its process group: watching it through "
                     "its status op (first after %gs)", rt.key, self.status_poll_s)
            status = asyncio.create_task(detachedwatch.watch(rt.key, lambda: ops.run_op(
                rt.ctx, self.node, rt.svc.name, "status", timeout_s=ops.OP_TIMEOUTS["status"],
                registry=self.registry), self.status_poll_s), name=f"status {rt.key}")
            waits.add(status)
        if not waits:
            return None
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            pending = {t for t in (group, status) if t is not None and not t.done()}
            for t in pending:
                t.cancel()
            if pending:  # a status op in flight ends its own group before we go on
                await asyncio.wait(pending)
        escaped = escapewatch.take(watched)  # the escape check ended its group
        if escaped is not None:
            return escaped
        if ch is not None and ch.closed.done():
            return ch.closed.result()  # "the service closed its channel (...)" or a violation
        if status is not None:
            return status.result()
        return f"its process group {watched} died: no process of it is left"
