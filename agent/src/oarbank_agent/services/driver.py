"""The lifecycle driver: performs what ``lifecycle.decide`` says, one effect at a time per
service, and feeds the machine its inputs.

``poke`` asks ``decide`` and starts the effect it names (the starter's start, the stopper's
stop, the prober's probe) as the service's one task; when the effect is over, or a decision
input changes (users, a hold, its module disabled, new timings), or a timer it asked for
(backoff, idle) fires, it asks again. A service that became READY is watched
(``readywatch.py``); a failure the watch sees is the stopper's ``fail``, run as that task.
Adoption after an agent restart, letting a kept service go, and the shutdown enter and leave
the machine here too. Nothing here sleeps to watch state: waits are on futures and loop timers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services.prober import Prober
from oarbank_agent.services.readywatch import ReadyWatch
from oarbank_agent.services.runtime import ServiceRuntime
from oarbank_agent.services.starter import Starter
from oarbank_agent.services.states import LOGGER, ServiceStates
from oarbank_agent.services.stopper import Stopper
from oarbank_sdk import manifest as mf

if TYPE_CHECKING:
    from oarbank_agent.broker.channel import Channel
    from oarbank_agent.platform.api import Group

__all__ = ["LifecycleDriver"]

log = logging.getLogger(LOGGER)


class LifecycleDriver:
    def __init__(self, states: ServiceStates, *, starter: Starter, stopper: Stopper,
                 prober: Prober, watch: ReadyWatch) -> None:
        self.states = states
        self.starter = starter
        self.stopper = stopper
        self.prober = prober
        self.watch = watch

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
            reason = d.reason or "stop"
            rt.task = asyncio.create_task(self._effect(rt, lambda: self.stopper.stop(rt, reason)),
                                          name=f"stop {rt.key}")
        elif d.action == "forget":
            # BACKOFF -> STOPPED: no process to end, the pending restart is dropped.
            self.states.transition(rt, lc.Event.FORGET)
        elif d.action == "probe":
            rt.task = asyncio.create_task(self._effect(rt, lambda: self.prober.probe(rt)),
                                          name=f"probe {rt.key}")
        elif d.wake_at is not None:
            loop = asyncio.get_running_loop()
            rt.timer = loop.call_at(loop.time() + max(0.0, d.wake_at - now), self.poke, rt)

    async def _effect(self, rt: ServiceRuntime, effect: Callable[[], Awaitable[None]]) -> None:
        """Run one effect as the service's task, then ask again (not after a cancel: the
        shutdown asks for itself)."""
        await effect()
        self._after_effect(rt)

    async def _start(self, rt: ServiceRuntime) -> None:
        if await self.starter.start(rt):
            self._watch(rt, rt.channel)
        self._after_effect(rt)

    def _after_effect(self, rt: ServiceRuntime) -> None:
        rt.task = None
        self.poke(rt)

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

    # --- a ready service failing on its own -----------------------------------------------

    def _watch(self, rt: ServiceRuntime, ch: Channel | None) -> None:
        rt.watch = asyncio.create_task(self._watched(rt, ch), name=f"watch {rt.key}")

    async def _watched(self, rt: ServiceRuntime, ch: Channel | None) -> None:
        error = await self.watch.until_failed(rt, ch)
        if error is None:
            return  # nothing of it to watch
        if rt.channel is not ch or rt.st.state is not lc.State.READY or rt.busy():
            return  # we are stopping it ourselves
        rt.task = asyncio.create_task(self._effect(rt, lambda: self.stopper.fail(rt, error)),
                                      name=f"fail {rt.key}")

    # --- inputs ---------------------------------------------------------------------------

    def set_users(self, key: str, users: int) -> None:
        rt = self.states.services[key]
        if users == rt.st.users:
            return
        now = time.time()
        if users > rt.st.users or users == 0:  # one more use, or the last one left
            self.states.stats.used(key, now, arrived=users > rt.st.users)
        rt.st = lc.set_users(rt.st, users, now)
        self.states.changed(rt)
        self.poke(rt)

    def set_hold(self, key: str, reason: str | None) -> bool:
        """Hold a service down (``reason``) or lift its hold (None). A held service is
        stopped (stop reason = the hold), its pools count 0 and it is not started again until
        the hold lifts (``lifecycle.decide``); waiting connects are refused. Returns whether
        anything changed."""
        rt = self.states.services[key]
        if rt.st.held == reason:
            return False
        log.info("%s: %s", key, f"held: {reason}" if reason else f"hold {rt.st.held} lifted")
        rt.st = lc.set_held(rt.st, reason)
        if reason is not None:
            self.states.resolve_waiters(rt, False)
        self._inputs_changed(rt)
        return True

    def evict(self, key: str, for_what: str) -> None:
        """Demand eviction: stop this idle service (reason ``evicted``) to make room for
        ``for_what`` (a job, of a module). Nothing happens if it has users by now."""
        rt = self.states.services[key]
        rt.st = lc.set_evict(rt.st, for_what)
        self.poke(rt)

    def set_disabled(self, key: str, disabled: bool, *, live: bool = True) -> bool:
        """Its module is disabled or enabled (``lifecycle.set_disabled``): not started, pools
        0, stopped once it has no users. ``live`` False (before the agent runs): the state
        only, nothing is poked (recovery comes first). Returns whether anything changed."""
        rt = self.states.services[key]
        if rt.st.disabled == disabled:
            return False
        rt.st = lc.set_disabled(rt.st, disabled)
        if not live:
            return True
        log.info("%s: %s", key, "disabled" if disabled else "enabled")
        if disabled:
            self.states.resolve_waiters(rt, False)  # admitted jobs waiting for a start: released
        self._inputs_changed(rt)
        return True

    def _inputs_changed(self, rt: ServiceRuntime) -> None:
        """A decision input (held, disabled) changed: act on what decide now says."""
        # Before the capacity listeners: a start in flight is cancelled at once (decide says
        # `cancel`), so nothing reads it as starting meanwhile.
        self._cancel_if_decided(rt)
        self.states.capacity_changed(rt)
        self.states.changed(rt)
        self.poke(rt)

    def set_timings(self, key: str, svc: mf.Service, *, live: bool = True) -> None:
        """The service with new timings (overrides.py): the next start and stop use them,
        and (``live``: a reload) the idle timer is measured again now (``poke``), not at its
        old deadline. Before the agent runs nothing is poked (recovery comes first)."""
        rt = self.states.services[key]
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
            self.states.changed(rt)
            self.poke(rt)

    def set_gpu_missing(self, key: str, text: str | None) -> None:
        """GPU placement (agent start): the GPU_API_MISSING text, or None (it may run here)."""
        rt = self.states.services[key]
        rt.st = lc.set_gpu_missing(rt.st, text)

    def set_faults(self, *, idle_stop: bool, flat_backoff: bool) -> None:
        """Test-only fault injection (faults.py), into every service's state."""
        for rt in self.states.services.values():
            rt.st = lc.with_faults(rt.st, idle_stop=idle_stop, flat_backoff=flat_backoff)

    # --- entering and leaving the machine: adoption, a kept service let go, shutdown -------

    def adopt(self, rt: ServiceRuntime, group: Group | None) -> None:
        """Agent restart: take over a running non-endpoint service (its group, if recorded)."""
        assert not rt.svc.endpoint, "endpoint services are never adopted"
        rt.group = group
        # STOPPED -> READY (adopted: found running, not started twice)
        self.states.transition(rt, lc.Event.ADOPT)
        self._watch(rt, None)
        self.poke(rt)

    def adopt_endpoint(self, rt: ServiceRuntime, ch: Channel, group: Group | None,
                       idle_since: float | None) -> None:
        """Agent restart with ``--keep-services``: take back an endpoint service proven the
        one the previous agent kept (``keep/decide.py``), with its kept channel; its idle
        clock goes on from where it was (users come back with the jobs that use it)."""
        rt.channel, rt.group = ch, group
        rt.says_ready = ch.ready_said.done()
        ch.on_ready = None  # it is ready already: a `ready` line now changes nothing
        # STOPPED -> READY (adopted: its channel kept, proven the same process)
        self.states.transition(rt, lc.Event.ADOPT)
        if rt.st.users == 0 and idle_since is not None:
            rt.st = lc.resume_idle(rt.st, idle_since)
        self._watch(rt, ch)
        self.poke(rt)

    def let_go(self, rt: ServiceRuntime) -> None:
        """Agent shutdown with ``--keep-services``: a ready endpoint service the keeper holds
        the channel of goes on running; this agent forgets it (no stop order: nothing of it
        is stopped, its group's record stays for the next agent)."""
        if rt.watch is not None:
            rt.watch.cancel()
            rt.watch = None
        if rt.timer is not None:
            rt.timer.cancel()
            rt.timer = None
        self.states.resolve_waiters(rt, False)
        if rt.channel is not None:
            rt.channel.close()  # our end only: the keeper's copy keeps the channel open
            rt.channel = None
        rt.group = None
        del self.states.services[rt.key]
        log.info("%s: left running for the next agent (its channel is kept)", rt.key)

    async def shutdown(self) -> None:
        """Stop every service in contract stop order; forget pending restarts."""
        self.states.shutting_down = True
        services = self.states.services
        for rt in services.values():
            rt.st = lc.shut_down(rt.st)
            if rt.timer is not None:
                rt.timer.cancel()
                rt.timer = None
            self.states.resolve_waiters(rt, False)
        starting = [rt.task for rt in services.values()
                    if rt.busy() and rt.st.state is lc.State.STARTING]
        for t in starting:
            assert t is not None
            t.cancel()
        pending = [rt.task for rt in services.values() if rt.busy()]
        await asyncio.gather(*[t for t in pending if t is not None], return_exceptions=True)
        for rt in services.values():
            rt.task = None
            self.poke(rt)  # READY -> stop, BACKOFF -> forget
        pending = [rt.task for rt in services.values() if rt.busy()]
        await asyncio.gather(*[t for t in pending if t is not None], return_exceptions=True)
