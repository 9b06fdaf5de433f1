"""Asking a service what it offers: the ``fingerprint`` op read into its runtime (health, pools,
reserves, whether a manual one runs), and the probe of a withdrawn service whose backoff has
passed (a healthy fingerprint brings it back).
"""

from __future__ import annotations

import logging

from oarbank_agent import procs
from oarbank_agent.modules.loaded import NodeInfo
from oarbank_agent.services import fingerprint as fingerprints
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services import ops
from oarbank_agent.services.runtime import ServiceRuntime
from oarbank_agent.services.states import LOGGER, ServiceStates

__all__ = ["Prober"]

log = logging.getLogger(LOGGER)


class Prober:
    def __init__(self, node: NodeInfo, registry: procs.ProcessRegistry,
                 states: ServiceStates) -> None:
        self.node = node
        self.registry = registry
        self.states = states

    async def fingerprint(self, rt: ServiceRuntime) -> None:
        if rt.gpu_missing is not None:
            # Not offered on this node: no op runs, its pools do not exist.
            rt.fp_pools, rt.fp_error = {}, None
            self.states.changed(rt)
            self.states.capacity_changed(rt)
            return
        res = await ops.run_op(rt.ctx, self.node, rt.svc.name, "fingerprint",
                               timeout_s=ops.OP_TIMEOUTS["fingerprint"], registry=self.registry)
        if res.ok and res.doc is not None:
            fp = fingerprints.parse(res.doc)
            rt.health, rt.fp_pools, rt.fp_running = fp.health, fp.pools, fp.running
            rt.fp_reserve_gb, rt.fp_error = fp.reserve_gb, fp.problem
            rt.fp_reserve_gpu_gb, rt.fp_reserve_problem = fp.reserve_gpu_gb, fp.reserve_problem
            if fp.problem:
                log.warning("%s: %s", rt.key, fp.problem)
        else:
            rt.health = "unhealthy"
            rt.fp_pools = {}
            rt.fp_error = f"fingerprint failed: {res.error}"
            log.warning("%s: %s", rt.key, rt.fp_error)
        self.states.changed(rt)
        self.states.capacity_changed(rt)

    async def probe(self, rt: ServiceRuntime) -> None:
        """A withdrawn service whose backoff has passed: a healthy fingerprint brings it back."""
        await self.fingerprint(rt)
        if rt.health == "healthy" and rt.fp_error is None:
            # WITHDRAWN -> STOPPED (its pools count again; wanted -> started on the next poke)
            self.states.transition(rt, lc.Event.RECOVER)
            log.info("%s: un-withdrawn after a healthy fingerprint (failures so far: %d)",
                     rt.key, rt.st.failures)
            self.states.capacity_changed(rt)
        else:
            # WITHDRAWN -> WITHDRAWN (probe again one backoff later)
            self.states.transition(rt, lc.Event.PROBED)
