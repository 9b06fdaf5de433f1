"""Stopping a service (contract section 2): the stop order (``stop`` op, close the channel, end
the group, escalated when the op overran or left processes), the stop effect, and the
teardown of a ready service that failed on its own.
"""

from __future__ import annotations

import asyncio
import logging

from oarbank_agent import platform, procs
from oarbank_agent.modules.loaded import NodeInfo
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services import ops
from oarbank_agent.services.prober import Prober
from oarbank_agent.services.runtime import ServiceRuntime
from oarbank_agent.services.states import LOGGER, ServiceStates

__all__ = ["Stopper", "GROUP_GRACE_S", "ESCALATE_GRACE_S"]

log = logging.getLogger(LOGGER)

GROUP_GRACE_S = 5.0  # terminate -> kill for a service's group at the end of the stop order
# A `stop` op that overran stop_timeout_s has had its chance: the group gets a short grace.
ESCALATE_GRACE_S = 2.0


class Stopper:
    def __init__(self, node: NodeInfo, registry: procs.ProcessRegistry, states: ServiceStates,
                 prober: Prober) -> None:
        self.node = node
        self.registry = registry
        self.states = states
        self.prober = prober  # capacities may differ once a service is down

    async def stop(self, rt: ServiceRuntime, reason: str) -> None:
        """The stop effect: READY -> STOPPING, the stop order, -> STOPPED."""
        self.states.transition(rt, lc.Event.STOP, reason=reason)
        await self.teardown(rt, run_stop=True)
        # STOPPING -> STOPPED
        self.states.transition(rt, lc.Event.STOPPED)
        if not self.states.shutting_down:
            await self.prober.fingerprint(rt)

    async def fail(self, rt: ServiceRuntime, error: str) -> None:
        """A ready service failed on its own (its watch saw it): the failure, then what is
        left of it ended (no `stop` op)."""
        rt.deaths += 1  # before anyone hears of it: an attempt ending now sees the death
        # READY -> BACKOFF | WITHDRAWN (first, so nobody is told it is ready meanwhile)
        self.states.transition(rt, lc.Event.FAILED, error=error)
        await self.teardown(rt, run_stop=False)
        await self.prober.fingerprint(rt)

    async def teardown(self, rt: ServiceRuntime, *, run_stop: bool) -> None:
        """Stop order: `stop` op (when asked), close the channel, end the group."""
        if rt.watch is not None and rt.watch is not asyncio.current_task():
            rt.watch.cancel()
        rt.watch = None
        overran = False
        if run_stop:
            if rt.channel is not None:
                rt.channel.expect_close()  # its daemon closing the channel now is the stop
            res = await ops.run_op(rt.ctx, self.node, rt.svc.name, "stop",
                                   timeout_s=rt.svc.stop_timeout_s, registry=self.registry)
            if not res.ok:
                log.warning("%s: %s", rt.key, res.error)
            # rc None with a started op: it ran past stop_timeout_s (its own group is ended).
            overran = res.rc is None and res.group is not None
            if res.doc is not None and res.doc.get("escalated") is True:
                log.info("%s: the stop op reports it escalated", rt.key)
        if rt.channel is not None:
            rt.channel.close()
            rt.channel = None
        group, killed, grace = rt.group, False, GROUP_GRACE_S
        if group is not None:
            # A stop that overran has had its chance: a short grace, then it is killed.
            grace = ESCALATE_GRACE_S if overran else GROUP_GRACE_S
            killed = await procs.retire_group(self.registry, group, grace)
            rt.group = None
        if run_stop and (overran or killed):
            what = (f"the stop op did not finish within stop_timeout_s="
                    f"{rt.svc.stop_timeout_s:g}" if overran
                    else "processes were left after the stop op")
            end = platform.current().groups.ending(killed, grace)
            rt.stop_note = (f"stop escalated: {what}; process group {group} ended ({end})"
                            if group is not None else f"stop escalated: {what}")
            log.warning("%s: %s", rt.key, rt.stop_note)
