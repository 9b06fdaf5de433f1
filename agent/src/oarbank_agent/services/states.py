"""Every service's state and each change to it: ``lifecycle.apply``'s transitions performed here
(logged, waiters woken, listeners told, load times and uses kept), and the waits on readiness
that those transitions end (the broker's ``ServiceGate`` and the admitted jobs' wait).

The one holder of ``ServiceRuntime`` objects and their listeners; the effects (``starter.py``,
``stopper.py``, ``prober.py``) and the driver (``driver.py``) change a service only through
``transition`` and say what else changed through ``changed`` and ``capacity_changed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from oarbank_agent.eventwait import result_within
from oarbank_agent.modules.loaded import ModuleCtx
from oarbank_agent.operate import logsetup
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services.loadstats import LoadStats
from oarbank_agent.services.runtime import ServiceRuntime, ready, service_key

__all__ = ["ServiceStates", "LOGGER"]

# One logger for the supervisor's parts: operators and the harness's scenarios read the state
# changes under this name (``<key>: ready -> stopping (stop): ...``).
LOGGER = "oarbank_agent.services.supervisor"
log = logging.getLogger(LOGGER)


class ServiceStates:
    def __init__(self, stats: LoadStats) -> None:
        self.services: dict[str, ServiceRuntime] = {}
        # Measured load times and uses, kept across runs (demand eviction's inputs).
        self.stats = stats
        self.on_change: list[Callable[[str], None]] = []  # fired on every service change
        self.on_capacity: list[Callable[[str], None]] = []  # pools of a service changed
        # Set once by the driver's ``shutdown`` (and into every service's state, where
        # decisions read it); the effects read it here: no fingerprint after a stop, a
        # cancelled start re-raises, an admitted job stops waiting.
        self.shutting_down = False

    def add_module(self, ctx: ModuleCtx) -> list[ServiceRuntime]:
        """A runtime for each service of ``ctx``, STOPPED, with the manifest's timings."""
        added = []
        for svc in ctx.manifest.services:
            r = svc.restart
            st = lc.ServiceState(svc.lifecycle, svc.idle_timeout_s, r.backoff_initial_s,
                                 r.backoff_max_s, r.max_failures)
            rt = ServiceRuntime(service_key(ctx.id, svc.name), ctx, svc, st)
            self.services[rt.key] = rt
            added.append(rt)
        return added

    # --- changes --------------------------------------------------------------------------

    def transition(self, rt: ServiceRuntime, event: lc.Event, **kw: Any) -> None:
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
            self.resolve_waiters(rt, True)
        elif rt.st.state is lc.State.STOPPED and event is lc.Event.STOPPED:
            self.stats.save()  # its uses so far, for the next agent
        elif rt.st.state is lc.State.WITHDRAWN:
            self.resolve_waiters(rt, False)
            self.capacity_changed(rt)  # a withdrawn service's pools count 0
        self.changed(rt)

    def changed(self, rt: ServiceRuntime) -> None:
        """Tell the ``on_change`` listeners (status, heartbeats, watchers)."""
        for cb in list(self.on_change):
            try:
                cb(rt.key)
            except Exception:  # a listener's bug must not break supervision
                log.exception("on_change listener failed")

    def capacity_changed(self, rt: ServiceRuntime) -> None:
        """Tell the ``on_capacity`` listeners (admission): its pools count differently now."""
        for cb in self.on_capacity:
            cb(rt.key)

    def resolve_waiters(self, rt: ServiceRuntime, value: bool) -> None:
        waiters, rt.waiters = rt.waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(value)

    # --- waits on readiness: the broker's ServiceGate and the jobs' wait ------------------

    def _hopeless(self, rt: ServiceRuntime | None) -> bool:
        return rt is None or lc.hopeless(rt.st)

    def ready_now(self, service_key: str) -> bool:
        """ServiceGate's optional synchronous check: True iff ``wait_ready`` would answer True
        at once (the broker then hands a connect over without waiting)."""
        rt = self.services.get(service_key)
        return rt is not None and not self._hopeless(rt) and ready(rt)

    async def wait_ready(self, service_key: str) -> bool:
        """ServiceGate: True once ready; False if not within start_timeout_s, or never."""
        rt = self.services.get(service_key)
        if rt is None or self._hopeless(rt):
            return False
        if ready(rt):
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        rt.waiters.append(fut)
        try:
            came, is_ready = await result_within(fut, rt.svc.start_timeout_s)
            return came and bool(is_ready)
        finally:
            with contextlib.suppress(ValueError):
                rt.waiters.remove(fut)

    async def await_ready(self, service_key: str) -> bool:
        """For an admitted job: wait through starts and backoffs; False once withdrawn or the
        agent is shutting down."""
        rt = self.services.get(service_key)
        if rt is not None and rt.svc.lifecycle == "manual" and not self.shutting_down:
            return True  # never started by us: its fingerprint's pools are the only gate
        while True:
            if rt is None or self._hopeless(rt):
                return False
            if ready(rt):
                return True
            fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            rt.waiters.append(fut)
            try:
                if await fut:
                    continue  # re-check: the channel must still be open
                return False
            finally:
                with contextlib.suppress(ValueError):
                    rt.waiters.remove(fut)
