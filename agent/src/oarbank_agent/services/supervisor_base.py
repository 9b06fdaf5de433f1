"""The supervisor's core: its state, the decision loop (``poke``: ask ``lifecycle.decide``, start
what it says), transitions (each logged, waiters woken, listeners told) and the fingerprint.

The effects the loop starts are the subclasses': ``starting.py`` (a start, until ready),
``stopping.py`` (stops, failures, probes, adoption, shutdown); ``supervisor.py`` joins them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from oarbank_agent import procs
from oarbank_agent.modules.loaded import NodeInfo
from oarbank_agent.operate import logsetup
from oarbank_agent.services import detachedwatch, ops
from oarbank_agent.services import fingerprint as fingerprints
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services.loadstats import LoadStats
from oarbank_agent.services.runtime import ServiceRuntime

if TYPE_CHECKING:
    from oarbank_agent.broker.channel import Channel, Channels

__all__ = ["SupervisorBase"]

log = logging.getLogger("oarbank_agent.services.supervisor")


class SupervisorBase:
    def __init__(self, node: NodeInfo, registry: procs.ProcessRegistry, *,
                 channels: Channels, status_poll_s: float = detachedwatch.DEFAULT_FIRST_S) -> None:
        self.node = node
        self.registry = registry
        self.channels = channels  # endpoint channels, shared with the broker
        self.services: dict[str, ServiceRuntime] = {}
        # Measured load times and uses, kept across runs (demand eviction's inputs).
        self.stats = LoadStats(node.state_dir)
        self.on_change: list[Callable[[str], None]] = []  # fired on every service change
        self.on_capacity: list[Callable[[str], None]] = []  # pools of a service changed
        # Set once by ``shutdown`` (and into every service's state, where decisions read it);
        # the effects read it here: no fingerprint after a stop, a cancelled start re-raises.
        self.shutting_down = False
        # First interval of the sparse `status` polls (detachedwatch; --status-poll-s).
        self.status_poll_s = status_poll_s
        # True only under the test-only fault OARBANK_AGENT_FAULT=bare_start_errors: an effect
        # (the error text), not a decision.
        self.bare_start_errors = False

    # --- the effects (starting.py, stopping.py) -------------------------------------------

    async def _start(self, rt: ServiceRuntime) -> None:
        raise NotImplementedError

    async def _stop(self, rt: ServiceRuntime, reason: str) -> None:
        raise NotImplementedError

    async def _probe(self, rt: ServiceRuntime) -> None:
        raise NotImplementedError

    async def _teardown(self, rt: ServiceRuntime, *, run_stop: bool) -> None:
        raise NotImplementedError

    async def _watch(self, rt: ServiceRuntime, ch: Channel | None) -> None:
        raise NotImplementedError

    async def fingerprint(self, rt: ServiceRuntime) -> None:
        if rt.gpu_missing is not None:
            # Not offered on this node: no op runs, its pools do not exist.
            rt.fp_pools, rt.fp_error = {}, None
            self._changed(rt)
            for cb in self.on_capacity:
                cb(rt.key)
            return
        res = await ops.run_op(rt.ctx, self.node, rt.svc.name, "fingerprint",
                               timeout_s=ops.OP_TIMEOUTS["fingerprint"], registry=self.registry)
        if res.ok and res.doc is not None:
            fp = fingerprints.parse(res.doc)
            rt.health, rt.fp_pools, rt.fp_running = fp.health, fp.pools, fp.running
            rt.fp_reserve_gb, rt.fp_error = fp.reserve_gb, fp.problem
            rt.fp_reserve_gpu_gb = fp.reserve_gpu_gb
            if fp.problem:
                log.warning("%s: %s", rt.key, fp.problem)
        else:
            rt.health = "unhealthy"
            rt.fp_pools = {}
            rt.fp_error = f"fingerprint failed: {res.error}"
            log.warning("%s: %s", rt.key, rt.fp_error)
        self._changed(rt)
        for cb in self.on_capacity:
            cb(rt.key)

    # --- the decision loop ----------------------------------------------------------------

    def poke(self, rt: ServiceRuntime) -> None:
        """Ask the state machine what to do now and start doing it."""
        if rt.timer is not None:
            rt.timer.cancel()
            rt.timer = None
        if rt.busy():
            return  # the effect in flight pokes again when it is over
        now = time.time()
        d = lc.decide(rt.st, now)
        if d.action == "start":
            rt.task = asyncio.create_task(self._start(rt), name=f"start {rt.key}")
        elif d.action == "stop":
            rt.task = asyncio.create_task(self._stop(rt, d.reason or "stop"),
                                          name=f"stop {rt.key}")
        elif d.action == "forget":
            # BACKOFF -> STOPPED: no process to end, the pending restart is dropped.
            self._transition(rt, lc.Event.FORGET)
        elif d.action == "probe":
            rt.task = asyncio.create_task(self._probe(rt), name=f"probe {rt.key}")
        elif d.wake_at is not None:
            loop = asyncio.get_running_loop()
            rt.timer = loop.call_at(loop.time() + max(0.0, d.wake_at - now), self.poke, rt)

    def _cancel_if_decided(self, rt: ServiceRuntime) -> None:
        """``cancel`` (a hold on a starting service): the start task ends the process group,
        closes the channel and stops it with the hold as the reason (no failure). Only while
        the start may still be cancelled: not once it is tearing down a failed start."""
        if not (rt.busy() and rt.cancellable and rt.task is not None):
            return
        d = lc.decide(rt.st, time.time())
        if d.action == "cancel":
            rt.cancelled_for = d.reason
            rt.cancellable = False
            rt.task.cancel()

    def _after_effect(self, rt: ServiceRuntime) -> None:
        rt.task = None
        self.poke(rt)

    def _transition(self, rt: ServiceRuntime, event: lc.Event, **kw: Any) -> None:
        before = rt.st.state
        rt.st = lc.apply(rt.st, event, time.time(), **kw)
        # A failure is what an operator acts on (WARNING); every other transition, idle stops
        # included, is the node working (INFO).
        level = logging.WARNING if event is lc.Event.FAILED else logging.INFO
        why = (f": {rt.st.error}" if event is lc.Event.FAILED and rt.st.error else
               f": {rt.st.stopped_reason}" if event is lc.Event.STOP and rt.st.stopped_reason
               else "")
        log.log(level, "%s: %s -> %s (%s)%s", rt.key, before.value, rt.st.state.value,
                event.value, why, extra=logsetup.fields(service_key=rt.key))
        if rt.st.state is lc.State.READY:
            rt.ready_at = time.time()
            rt.stop_note = None
            if event is lc.Event.READY and rt.start_began is not None:
                self.stats.loaded(rt.key, time.monotonic() - rt.start_began)  # start to ready
            self._resolve_waiters(rt, True)
        elif rt.st.state is lc.State.STOPPED and event is lc.Event.STOPPED:
            self.stats.save()  # its uses so far, for the next agent
        elif rt.st.state is lc.State.WITHDRAWN:
            self._resolve_waiters(rt, False)
            for cb in self.on_capacity:
                cb(rt.key)  # a withdrawn service's pools count 0
        self._changed(rt)

    def _changed(self, rt: ServiceRuntime) -> None:
        for cb in list(self.on_change):
            try:
                cb(rt.key)
            except Exception:  # a listener's bug must not break supervision
                log.exception("on_change listener failed")

    def _resolve_waiters(self, rt: ServiceRuntime, value: bool) -> None:
        waiters, rt.waiters = rt.waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(value)
