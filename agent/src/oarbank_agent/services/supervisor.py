"""The supervisor: performs what ``lifecycle.decide`` says, and reports back with ``apply``.

Effects only. One ``ServiceRuntime`` per service; at most one effect task (start, stop or a
failure's teardown) runs per service at a time, and ``poke`` asks the pure machine again when
it is over, when users change, or when a timer (backoff, idle) fires. Nothing here sleeps to
watch state: waits are on futures (hello, channel closed, readiness) and loop timers. The one
thing polled is the ``ready`` op, for services that do not say ``ready`` on their channel.

Every decision and everything it reads (users, holds, a missing GPU API, shutdown, the test
faults) is in ``rt.st`` and ``lifecycle.decide``; this module sets those inputs through the
lifecycle's functions and performs what comes back. ``row`` is a pure function of a runtime.

Start = channel pair from the broker + ``start`` op with the child end inherited + the hello +
``ready``: said on the channel (``OARBANK_ENDPOINT_FEATURES=ready``: the channel's reader makes
the service READY, and wakes the jobs waiting for it, in the loop turn the line arrives in), or
the ``ready`` op true (polled once the hello is in: at once, then on ``ready_poll_gap``'s
schedule; a ``ready`` line arriving meanwhile ends the polling), all within
``start_timeout_s``.
Stop order = ``stop`` op, close the channel, end the group.
This class is also the broker's ``ServiceGate``; it opens channels in the ``Channels`` table it
shares with the broker (given at construction: neither holds the other).

Its parts, one concern each: ``runtime.py`` (a service's runtime, the pure ``row``),
``supervisor_base.py`` (the decision loop, transitions, the fingerprint), ``starting.py`` (the
start), ``stopping.py`` (stops, failures, probes, adoption, shutdown); this file joins them and
holds the inputs and the readiness gate. Every public name stays importable from here.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from oarbank_agent.eventwait import result_within
from oarbank_agent.modules.loaded import ModuleCtx
from oarbank_agent.sandbox import refusals
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services.runtime import (
    ServiceRuntime,
    StartFailed,
    details,
    ready,
    row,
    service_key,
)
from oarbank_agent.services.starting import (
    EXIT_WAIT_S,
    READY_POLL_FALLBACK_S,
    READY_POLL_IN_FLIGHT,
    READY_POLL_MAX_S,
    READY_POLL_MIN_FACTORY_S,
    READY_POLL_MIN_S,
    READY_POLL_RATIO,
    Starting,
    ready_poll_gap,
)
from oarbank_agent.services.stopping import ESCALATE_GRACE_S, GROUP_GRACE_S, Stopping
from oarbank_sdk import manifest as mf

__all__ = ["Supervisor", "ServiceRuntime", "StartFailed", "service_key", "row", "ready", "details",
           "ready_poll_gap", "READY_POLL_MIN_S", "READY_POLL_MIN_FACTORY_S", "READY_POLL_RATIO",
           "READY_POLL_MAX_S", "READY_POLL_FALLBACK_S", "READY_POLL_IN_FLIGHT", "EXIT_WAIT_S",
           "GROUP_GRACE_S", "ESCALATE_GRACE_S"]

log = logging.getLogger("oarbank_agent.services.supervisor")


class Supervisor(Starting, Stopping):
    """One per agent: the services, their inputs, the readiness the broker and jobs wait on;
    the effects are ``Starting``'s and ``Stopping``'s, the loop ``SupervisorBase``'s."""

    # --- set-up ---------------------------------------------------------------------------

    def add_module(self, ctx: ModuleCtx) -> list[ServiceRuntime]:
        added = []
        for svc in ctx.manifest.services:
            r = svc.restart
            st = lc.ServiceState(svc.lifecycle, svc.idle_timeout_s, r.backoff_initial_s,
                                 r.backoff_max_s, r.max_failures)
            rt = ServiceRuntime(service_key(ctx.id, svc.name), ctx, svc, st)
            self.services[rt.key] = rt
            added.append(rt)
        return added

    # --- views ----------------------------------------------------------------------------

    def capacities(self, key: str) -> dict[str, int]:
        """pool name -> tokens this service offers now (0 unless ``lifecycle.offered``)."""
        rt = self.services[key]
        on = lc.offered(rt.st)  # withdrawn, held or no GPU API: its pools count 0
        return {p: (max(0, int(rt.fp_pools.get(p, 0))) if on else 0) for p in rt.svc.pools}

    def is_ready(self, rt: ServiceRuntime) -> bool:
        return ready(rt)

    def row(self, rt: ServiceRuntime) -> dict[str, Any]:
        """Contract section 6 row (``row`` with what the sandbox refused this service)."""
        return row(rt, refusals.current().describe(rt.key))

    # --- inputs ---------------------------------------------------------------------------

    def set_users(self, key: str, users: int) -> None:
        rt = self.services[key]
        if users == rt.st.users:
            return
        now = time.time()
        if users > rt.st.users or users == 0:  # one more use, or the last one left
            self.stats.used(key, now, arrived=users > rt.st.users)
        rt.st = lc.set_users(rt.st, users, now)
        self._changed(rt)
        self.poke(rt)

    def set_hold(self, key: str, reason: str | None) -> bool:
        """Hold a service down (``reason``) or lift its hold (None). A held service is
        stopped (stop reason = the hold), its pools count 0 and it is not started again until
        the hold lifts (``lifecycle.decide``); waiting connects are refused. Returns whether
        anything changed."""
        rt = self.services[key]
        if rt.st.held == reason:
            return False
        log.info("%s: %s", key, f"held: {reason}" if reason else f"hold {rt.st.held} lifted")
        rt.st = lc.set_held(rt.st, reason)
        if reason is not None:
            self._resolve_waiters(rt, False)
        self._inputs_changed(rt)
        return True

    def evict(self, key: str, for_what: str) -> None:
        """Demand eviction: stop this idle service (reason ``evicted``) to make room for
        ``for_what`` (a job, of a module). Nothing happens if it has users by now."""
        rt = self.services[key]
        rt.st = lc.set_evict(rt.st, for_what)
        self.poke(rt)

    def set_disabled(self, key: str, disabled: bool, *, live: bool = True) -> bool:
        """Its module is disabled or enabled (``lifecycle.set_disabled``): not started, pools
        0, stopped once it has no users. ``live`` False (before the agent runs): the state
        only, nothing is poked (recovery comes first). Returns whether anything changed."""
        rt = self.services[key]
        if rt.st.disabled == disabled:
            return False
        rt.st = lc.set_disabled(rt.st, disabled)
        if not live:
            return True
        log.info("%s: %s", key, "disabled" if disabled else "enabled")
        if disabled:
            self._resolve_waiters(rt, False)  # admitted jobs waiting for a start: released
        self._inputs_changed(rt)
        return True

    def _inputs_changed(self, rt: ServiceRuntime) -> None:
        """A decision input (held, disabled) changed: act on what decide now says."""
        # Before the capacity listeners: a start in flight is cancelled at once (decide says
        # `cancel`), so nothing reads it as starting meanwhile.
        self._cancel_if_decided(rt)
        for cb in self.on_capacity:
            cb(rt.key)
        self._changed(rt)
        self.poke(rt)

    def set_timings(self, key: str, svc: mf.Service, *, live: bool = True) -> None:
        """The service with new timings (overrides.py): the next start and stop use them,
        and (``live``: a reload) the idle timer is measured again now (``poke``), not at its
        old deadline. Before the agent runs nothing is poked (recovery comes first)."""
        rt = self.services[key]
        rt.svc = svc
        r = svc.restart
        rt.st = lc.set_timings(rt.st, idle_timeout_s=svc.idle_timeout_s,
                               backoff_initial_s=r.backoff_initial_s,
                               backoff_max_s=r.backoff_max_s, max_failures=r.max_failures)
        log.info("%s: timings idle_timeout_s=%g start_timeout_s=%g stop_timeout_s=%g "
                 "backoff %g..%g s, max_failures %d", key, svc.idle_timeout_s,
                 svc.start_timeout_s, svc.stop_timeout_s, r.backoff_initial_s,
                 r.backoff_max_s, r.max_failures)
        if live:
            self._changed(rt)
            self.poke(rt)

    def set_gpu_missing(self, key: str, text: str | None) -> None:
        """GPU placement (agent start): the GPU_API_MISSING text, or None (it may run here)."""
        rt = self.services[key]
        rt.st = lc.set_gpu_missing(rt.st, text)

    def set_faults(self, *, idle_stop: bool, flat_backoff: bool) -> None:
        """Test-only fault injection (faults.py), into every service's state."""
        for rt in self.services.values():
            rt.st = lc.with_faults(rt.st, idle_stop=idle_stop, flat_backoff=flat_backoff)

    # --- readiness: the broker's ServiceGate and the jobs' wait ---------------------------

    def _hopeless(self, rt: ServiceRuntime | None) -> bool:
        return rt is None or lc.hopeless(rt.st)

    def ready_now(self, service_key: str) -> bool:
        """ServiceGate's optional synchronous check: True iff ``wait_ready`` would answer True
        at once (the broker then hands a connect over without waiting)."""
        rt = self.services.get(service_key)
        return rt is not None and not self._hopeless(rt) and self.is_ready(rt)

    async def wait_ready(self, service_key: str) -> bool:
        """ServiceGate: True once ready; False if not within start_timeout_s, or never."""
        rt = self.services.get(service_key)
        if rt is None or self._hopeless(rt):
            return False
        if self.is_ready(rt):
            return True
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        rt.waiters.append(fut)
        try:
            came, ready = await result_within(fut, rt.svc.start_timeout_s)
            return came and bool(ready)
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
            if self.is_ready(rt):
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
