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
the ``ready`` op true (polled once the hello is in: at once, then every 50 ms doubling up to
``ready_poll_cap``; a ``ready`` line arriving meanwhile ends the polling), all within
``start_timeout_s``.
Stop order = ``stop`` op, close the channel, end the group.
This class is also the broker's ``ServiceGate``; it opens channels in the ``Channels`` table it
shares with the broker (given at construction: neither holds the other).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oarbank_agent import factory, platform, procs
from oarbank_agent.eventwait import result_within
from oarbank_agent.modules.loaded import ModuleCtx, NodeInfo
from oarbank_agent.operate import logsetup, logtail
from oarbank_agent.sandbox import escapewatch, refusals
from oarbank_agent.services import detachedwatch, ops, servicelog
from oarbank_agent.services import fingerprint as fingerprints
from oarbank_agent.services import lifecycle as lc
from oarbank_sdk import advice
from oarbank_sdk import manifest as mf
from oarbank_sdk.protocol import current_transport
from oarbank_sdk.servicerow import ServiceRow

if TYPE_CHECKING:
    from oarbank_agent.broker.channel import Channel, Channels
    from oarbank_agent.platform.api import Group

__all__ = ["Supervisor", "ServiceRuntime", "service_key", "row", "ready", "details"]

log = logging.getLogger("oarbank_agent.services.supervisor")

GROUP_GRACE_S = 5.0  # terminate -> kill for a service's group at the end of the stop order
# A `stop` op that overran stop_timeout_s has had its chance: the group gets a short grace.
ESCALATE_GRACE_S = 2.0
READY_POLL_FIRST_S = 0.05
# Each poll is a process start: started directly (~50-150 ms of CPU) polling faster buys
# little, and a cap of 1 s made a service that had just loaded wait up to 1 s for its first
# job; from the process factory (a fork, a few ms) a 25 ms cap keeps that wait near 15 ms.
READY_POLL_MAX_S = 0.1
READY_POLL_MAX_FACTORY_S = 0.025
# A service that said `ready` on its channel before says it again: polled only as a fallback.
READY_POLL_FALLBACK_S = 1.0


def ready_poll_cap(*, factory: bool, says_ready: bool) -> float:
    """The longest wait between two polls of the `ready` op (they start at once, then every
    ``READY_POLL_FIRST_S`` doubling up to this)."""
    if says_ready:
        return READY_POLL_FALLBACK_S
    return READY_POLL_MAX_FACTORY_S if factory else READY_POLL_MAX_S
# A channel closed before the hello: how long the daemon may take to end (and to write why)
# before the start's group is ended, so its last log line can be quoted.
EXIT_WAIT_S = 2.0


def service_key(module_id: str, service: str) -> str:
    return f"{module_id}/{service}"


class StartFailed(Exception):
    pass


@dataclass
class ServiceRuntime:
    key: str
    ctx: ModuleCtx
    svc: mf.Service
    st: lc.ServiceState
    health: str = "undetected"
    fp_pools: dict[str, int] = field(default_factory=dict)  # from the last fingerprint
    fp_running: bool = False
    fp_error: str | None = None
    channel: Channel | None = None
    group: Group | None = None  # where its daemon lives (its start op's group)
    task: asyncio.Task[None] | None = None  # the effect in flight
    watch: asyncio.Task[None] | None = None  # watches a ready service's channel
    timer: asyncio.TimerHandle | None = None
    waiters: list[asyncio.Future[bool]] = field(default_factory=list)
    ready_at: float | None = None  # unix time of the last READY (tests compare with runners)
    stop_note: str | None = None  # the last stop escalated (shown as the row's error until READY)
    fp_reserve_gb: float = 0.0  # fingerprint's reserve.mem_gb (charged if reserves_host_memory)
    # A start in flight may be cancelled by a hold only while ``cancellable`` (not once it is
    # tearing down a failed start); ``cancelled_for`` is the hold that did it (its stop reason).
    cancellable: bool = False
    cancelled_for: str | None = None
    start_began: float | None = None  # monotonic time of the last START (jobs show the wait)
    starts: int = 0  # every START of this agent's life (status)
    restarts: int = 0  # the STARTs after a failure (from BACKOFF): what an operator watches
    # Failures while READY (it died on its own): an attempt that fails while this changed is
    # released, not charged (jobrun.py, jobs.after_attempt).
    deaths: int = 0
    # The start waits for readiness (hello in, `start` op done): a `ready` said on the channel
    # now makes the service READY at once (``Supervisor._ready_said``).
    awaiting_ready: bool = False
    says_ready: bool = False  # it said `ready` on its channel in a run of this agent's life

    def busy(self) -> bool:
        return self.task is not None and not self.task.done()

    # Host protection's inputs live in the lifecycle state (read here for views and logs).
    @property
    def held(self) -> str | None:
        """preempt_memory / preempt_protection while a hold keeps it down (guard.py)."""
        return self.st.held

    @property
    def gpu_missing(self) -> str | None:
        """The GPU_API_MISSING text when the host lacks its API."""
        return self.st.gpu_missing


def ready(rt: ServiceRuntime) -> bool:
    """Ready: READY and, for an endpoint service, its channel open."""
    if rt.st.state is not lc.State.READY:
        return False
    if rt.svc.endpoint:
        return rt.channel is not None and bool(rt.channel.is_open)
    return True


def details(rt: ServiceRuntime, now: float) -> dict[str, Any]:
    """What ``status`` adds to a row for an operator (not in heartbeats): the daemon's pid
    (its hello, else its group's leader) and its group, uptime, seconds until the idle stop, why it last
    stopped, starts and restarts (starts after a failure). ``now``: unix time."""
    s = rt.st
    pid = None
    if rt.channel is not None and rt.channel.hello.done() and not rt.channel.hello.cancelled():
        pid = rt.channel.hello.result()
    idle_in = None
    if s.state is lc.State.READY and rt.svc.lifecycle == "on_demand" and s.users == 0 \
            and s.idle_since is not None and s.idle_stop:
        idle_in = round(max(0.0, s.idle_since + s.idle_timeout_s - now), 1)
    return {
        "pid": pid if pid is not None else (rt.group.leader if rt.group is not None else None),
        **platform.current().groups.describe(rt.group),
        "uptime_s": round(now - rt.ready_at, 1) if s.state is lc.State.READY and rt.ready_at
        else None,
        "idle_stop_in_s": idle_in,
        "last_stop_reason": s.stopped_reason,
        "starts": rt.starts,
        "restarts": rt.restarts,
        "idle_timeout_s": s.idle_timeout_s,
    }


def row(rt: ServiceRuntime, refused: str | None = None) -> dict[str, Any]:
    """Contract section 6 row, from the runtime alone. ``refused``: what the sandbox refused
    the service (``refusals.describe``), added to an error."""
    s = rt.st.state
    up = s in (lc.State.STARTING, lc.State.READY, lc.State.STOPPING)
    error = rt.st.error or rt.fp_error or rt.stop_note
    return ServiceRow(
        module=rt.ctx.id,
        service=rt.svc.name,
        health=rt.health,
        running=up or (rt.svc.lifecycle == "manual" and rt.fp_running),
        ready=ready(rt),
        accepting=ready(rt) and not rt.st.shutting_down,
        # A failed service's error says how many network attempts the sandbox refused it.
        error=f"{error} ({refused})" if error and refused else error,
        held=rt.st.held,
        disabled=rt.st.disabled,  # its module is disabled here (module disable)
        withdrawn=s is lc.State.WITHDRAWN,
        gpu_api_missing=rt.st.gpu_missing is not None,
        lifecycle=rt.svc.lifecycle,
        users=rt.st.users,
        endpoint=rt.svc.endpoint,
    ).as_dict()


class Supervisor:
    def __init__(self, node: NodeInfo, registry: procs.ProcessRegistry, *,
                 channels: Channels, status_poll_s: float = detachedwatch.DEFAULT_FIRST_S) -> None:
        self.node = node
        self.registry = registry
        self.channels = channels  # endpoint channels, shared with the broker
        self.services: dict[str, ServiceRuntime] = {}
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
        rt.st = lc.set_users(rt.st, users, time.time())
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
            self._resolve_waiters(rt, True)
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

    # --- effects --------------------------------------------------------------------------

    async def _start(self, rt: ServiceRuntime) -> None:
        rt.starts += 1
        if rt.st.state is lc.State.BACKOFF:
            rt.restarts += 1
        # STOPPED|BACKOFF -> STARTING
        self._transition(rt, lc.Event.START)
        rt.cancellable, rt.cancelled_for = True, None
        rt.start_began = time.monotonic()
        # The daemon's part of the service log starts here (servicelog: rotation-proof).
        log_from = servicelog.get(rt.ctx.log_dir / f"{rt.svc.name}.log").mark()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + rt.svc.start_timeout_s
        ch = None
        try:
            env: dict[str, str] = {}
            inherit: tuple[int, ...] = ()
            if rt.svc.endpoint:
                ch = self.channels.open(rt.key)
                rt.channel = ch
                ch.on_ready = functools.partial(self._ready_said, rt, ch)
                # The child end, named the transport's way (fd:<n> here), inherited by `start`.
                env["OARBANK_ENDPOINT_CHANNEL"] = current_transport().format(ch.child_fd)
                inherit = (ch.child_fd,)
            res = await ops.run_op(rt.ctx, self.node, rt.svc.name, "start",
                                   timeout_s=max(0.1, deadline - loop.time()),
                                   registry=self.registry, extra_env=env, inherit=inherit,
                                   after_spawn=ch.close_child_end if ch else None,
                                   keep_group=True)
            rt.group = res.group
            if not res.ok:
                raise StartFailed("start failed" if self.bare_start_errors
                                  else res.error or "start failed")
            # Not wait_for: on Python < 3.12 it may swallow a shutdown's or a hold's cancel
            # that comes in the turn the service gets ready (eventwait.py).
            ready, _ = await result_within(self._until_ready(rt, ch, log_from),
                                           max(0.0, deadline - loop.time()))
            if not ready:
                raise asyncio.TimeoutError
        except (StartFailed, asyncio.TimeoutError) as exc:
            if rt.st.state is lc.State.READY and rt.channel is ch:
                # Said ready on the channel just as the deadline passed: it made it.
                rt.watch = asyncio.create_task(self._watch(rt, ch), name=f"watch {rt.key}")
                self._after_effect(rt)
                return
            rt.cancellable = False  # a hold arriving now finds it failed, not starting
            error = str(exc) if isinstance(exc, StartFailed) else (
                advice.no_hello(rt.svc.start_timeout_s) if ch and not ch.hello.done() else
                f"not ready within start_timeout_s={rt.svc.start_timeout_s:g} (ready never true)")
            await self._teardown(rt, run_stop=False)
            # STARTING -> BACKOFF | WITHDRAWN
            self._transition(rt, lc.Event.FAILED, error=error)
            self._after_effect(rt)
            return
        except asyncio.CancelledError:
            # Shutdown, or a hold, while starting: the full stop order, then STOPPED. A hold
            # is not a failure: nothing is counted against the restart policy.
            held, rt.cancelled_for, rt.cancellable = rt.cancelled_for, None, False
            task = asyncio.current_task()
            if held is not None and task is not None and hasattr(task, "uncancel"):
                task.uncancel()  # handled here: the teardown's own timeouts stay exact
            # STARTING -> STOPPING
            self._transition(rt, lc.Event.STOP, reason=held or "shutdown")
            await self._teardown(rt, run_stop=True)
            # STOPPING -> STOPPED
            self._transition(rt, lc.Event.STOPPED)
            if held is None or self.shutting_down:
                raise
            log.info("%s: start cancelled by the hold %s", rt.key, held)
            self._after_effect(rt)
            return
        rt.cancellable = False
        if rt.st.state is lc.State.STARTING:
            # STARTING -> READY (ready op true, or said before we waited; hello; channel open)
            self._transition(rt, lc.Event.READY)
        rt.watch = asyncio.create_task(self._watch(rt, ch), name=f"watch {rt.key}")
        self._after_effect(rt)

    async def _until_ready(self, rt: ServiceRuntime, ch: Channel | None,
                           log_from: int = 0) -> None:
        """Wait for the hello, then for `ready`: said on the channel, or the op polled."""
        if ch is None:
            await self._poll_ready(rt, None)
            return
        # `ready` may not answer true before the hello (contract), so polling earlier only
        # burns process starts while the service is still coming up.
        either: list[asyncio.Future[Any]] = [ch.hello, ch.closed]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not ch.hello.done():
            raise StartFailed(await self._closed_before_hello(rt, ch, log_from))
        try:
            await self._ready_after_hello(rt, ch)
        except StartFailed as exc:
            if ch.closed.done() and str(exc) == ch.closed.result():
                # It died while loading: say so, with its last words
                raise StartFailed(await self._closed_before_ready(rt, ch, log_from)) from None
            raise

    async def _ready_after_hello(self, rt: ServiceRuntime, ch: Channel) -> None:
        """After the hello: `ready` said on the channel, or the op polled until true."""
        if ch.ready_said.done():
            rt.says_ready = True
        else:
            poll = asyncio.create_task(self._poll_ready(rt, ch), name=f"ready poll {rt.key}")
            rt.awaiting_ready = True  # from now on a `ready` line makes it READY at once
            first: set[asyncio.Future[Any]] = {poll, ch.ready_said, ch.closed}
            try:
                await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
            finally:
                rt.awaiting_ready = False
                if not poll.done():
                    # The channel said it (the service is READY already) or the start is
                    # over: the op in flight is ended with its group before we go on.
                    poll.cancel()
                    await asyncio.wait({poll})
            if rt.st.state is lc.State.READY:
                return  # said on the channel: _ready_said made it READY
            if poll.done() and not poll.cancelled():
                poll.result()  # raises StartFailed for a channel closed meanwhile
        waits: set[asyncio.Future[Any]] = {ch.hello, ch.closed}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if ch.closed.done() or not ch.is_open:
            raise StartFailed(ch.closed.result() if ch.closed.done()
                              else advice.channel_closed("closed"))

    def _ready_said(self, rt: ServiceRuntime, ch: Channel) -> None:
        """The channel's reader got `ready` (contract section 3, the `ready` feature). While
        the start waits for readiness, the service is READY now, in this loop turn: the jobs
        waiting for it are woken from here (``_transition``), not when the start task runs
        again. Said earlier (the `start` op still running), the start finds it said."""
        if not (rt.awaiting_ready and rt.channel is ch and ch.is_open
                and rt.st.state is lc.State.STARTING):
            return
        rt.awaiting_ready = False
        rt.says_ready = True
        rt.cancellable = False  # a hold arriving now stops a ready service, as for any other
        # STARTING -> READY (said on the channel, hello, channel open)
        self._transition(rt, lc.Event.READY)

    async def _poll_ready(self, rt: ServiceRuntime, ch: Channel | None) -> None:
        """Poll the `ready` op until it answers true: at once, then 50 ms doubling to
        ``ready_poll_cap`` (25 ms apart from the process factory)."""
        cap = ready_poll_cap(factory=factory.current() is not None, says_ready=rt.says_ready)
        delay = min(READY_POLL_FIRST_S, cap)
        while True:
            if ch is not None and ch.closed.done():
                raise StartFailed(ch.closed.result())
            res = await ops.run_op(rt.ctx, self.node, rt.svc.name, "ready",
                                   timeout_s=ops.OP_TIMEOUTS["ready"], registry=self.registry)
            if res.ok and res.doc is not None and res.doc.get("ready") is True:
                break
            if ch is not None:
                await asyncio.wait({ch.closed}, timeout=delay)
            else:
                await asyncio.sleep(delay)  # the contract's `ready` poll, nothing else
            delay = min(delay * 2, cap)

    async def _closed_before_hello(self, rt: ServiceRuntime, ch: Channel, log_from: int) -> str:
        """Why the channel closed before the hello, in conform's words: whether the daemon is
        gone (a moment given to it) and the last line it wrote to the service log."""
        reason = ch.closed.result()
        if not reason.startswith(advice.CHANNEL_CLOSED):
            return reason  # a protocol violation says what it is
        left, last_line = await self._last_words(rt, log_from)
        return advice.closed_before_hello(reason, left, last_line)

    async def _closed_before_ready(self, rt: ServiceRuntime, ch: Channel, log_from: int) -> str:
        """The channel closed after the hello, before `ready`: the daemon died loading."""
        reason = ch.closed.result()
        if not reason.startswith(advice.CHANNEL_CLOSED):
            return reason
        _, last_line = await self._last_words(rt, log_from)
        return advice.closed_before_ready(reason, last_line)

    async def _last_words(self, rt: ServiceRuntime, log_from: int) -> tuple[bool, str | None]:
        """(whether a process of its start group still runs, a moment given to it to exit;
        the last line the service wrote to its log since ``log_from``)."""
        left = rt.group.members() if rt.group is not None else []
        waited = 0.0
        while left and waited < EXIT_WAIT_S:
            await asyncio.sleep(0.05)
            waited += 0.05
            left = rt.group.members() if rt.group is not None else []
        text = servicelog.get(rt.ctx.log_dir / f"{rt.svc.name}.log").since(log_from)
        return bool(left), logtail.summary(text)

    async def _watch(self, rt: ServiceRuntime, ch: Channel | None) -> None:
        """A ready service failing on its own: an endpoint service closing its channel, or
        its group dying (no live member left; ``Group.wait_gone``). A service that
        left nothing in its start group (it runs elsewhere) has only its channel watched, or,
        without a channel, its `status` op asked sparsely (detachedwatch)."""
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
            return
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
            error = escaped
        elif ch is not None and ch.closed.done():
            error = ch.closed.result()  # "the service closed its channel (...)" or a violation
        elif status is not None:
            error = status.result()
        else:
            error = f"its process group {watched} died: no process of it is left"
        if rt.channel is not ch or rt.st.state is not lc.State.READY or rt.busy():
            return  # we are stopping it ourselves
        rt.task = asyncio.create_task(self._fail_running(rt, error), name=f"fail {rt.key}")

    async def _fail_running(self, rt: ServiceRuntime, error: str) -> None:
        rt.deaths += 1  # before anyone hears of it: an attempt ending now sees the death
        # READY -> BACKOFF | WITHDRAWN (first, so nobody is told it is ready meanwhile)
        self._transition(rt, lc.Event.FAILED, error=error)
        await self._teardown(rt, run_stop=False)
        await self.fingerprint(rt)
        self._after_effect(rt)

    async def _probe(self, rt: ServiceRuntime) -> None:
        """A withdrawn service whose backoff has passed: a healthy fingerprint brings it back."""
        await self.fingerprint(rt)
        if rt.health == "healthy" and rt.fp_error is None:
            # WITHDRAWN -> STOPPED (its pools count again; wanted -> started on the next poke)
            self._transition(rt, lc.Event.RECOVER)
            log.info("%s: un-withdrawn after a healthy fingerprint (failures so far: %d)",
                     rt.key, rt.st.failures)
            for cb in self.on_capacity:
                cb(rt.key)
        else:
            # WITHDRAWN -> WITHDRAWN (probe again one backoff later)
            self._transition(rt, lc.Event.PROBED)
        self._after_effect(rt)

    def adopt(self, rt: ServiceRuntime, group: Group | None) -> None:
        """Agent restart: take over a running non-endpoint service (its group, if recorded)."""
        assert not rt.svc.endpoint, "endpoint services are never adopted"
        rt.group = group
        # STOPPED -> READY (adopted: found running, not started twice)
        self._transition(rt, lc.Event.ADOPT)
        rt.watch = asyncio.create_task(self._watch(rt, None), name=f"watch {rt.key}")
        self.poke(rt)

    async def _stop(self, rt: ServiceRuntime, reason: str) -> None:
        # READY -> STOPPING
        self._transition(rt, lc.Event.STOP, reason=reason)
        await self._teardown(rt, run_stop=True)
        # STOPPING -> STOPPED
        self._transition(rt, lc.Event.STOPPED)
        if not self.shutting_down:
            await self.fingerprint(rt)  # capacities may differ once it is down
        self._after_effect(rt)

    async def _teardown(self, rt: ServiceRuntime, *, run_stop: bool) -> None:
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

    # --- shutdown -------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Stop every service in contract stop order; forget pending restarts."""
        self.shutting_down = True
        for rt in self.services.values():
            rt.st = lc.shut_down(rt.st)
            if rt.timer is not None:
                rt.timer.cancel()
                rt.timer = None
            self._resolve_waiters(rt, False)
        starting = [rt.task for rt in self.services.values()
                    if rt.busy() and rt.st.state is lc.State.STARTING]
        for t in starting:
            assert t is not None
            t.cancel()
        pending = [rt.task for rt in self.services.values() if rt.busy()]
        await asyncio.gather(*[t for t in pending if t is not None], return_exceptions=True)
        for rt in self.services.values():
            rt.task = None
            self.poke(rt)  # READY -> stop, BACKOFF -> forget
        pending = [rt.task for rt in self.services.values() if rt.busy()]
        await asyncio.gather(*[t for t in pending if t is not None], return_exceptions=True)

