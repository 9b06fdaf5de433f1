"""Starting a service (contract section 2): channel pair from the broker + ``start`` op with the
child end inherited + the hello + ``ready``: said on the channel (``OARBANK_ENDPOINT_FEATURES=
ready``: the channel's reader makes the service READY, and wakes the jobs waiting for it, in the
loop turn the line arrives in), or the ``ready`` op true (polled once the hello is in: at once,
then on the schedule of ``ready_poll_gap``; a ``ready`` line arriving meanwhile ends the
polling), all within ``start_timeout_s``. A failed start says why in conform's words (the
daemon's last line in its log) and is torn down by the stop order (``stopper.py``); a start
cancelled by a hold or the shutdown is stopped in full.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from oarbank_agent import factory, procs
from oarbank_agent.eventwait import result_within
from oarbank_agent.modules.loaded import NodeInfo
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services import ops, servicelog
from oarbank_agent.services.runtime import ServiceRuntime, StartFailed
from oarbank_agent.services.states import LOGGER, ServiceStates
from oarbank_agent.services.stopper import Stopper
from oarbank_sdk import advice, logtail
from oarbank_sdk.protocol import current_transport

if TYPE_CHECKING:
    from oarbank_agent.broker.channel import Channel, Channels

__all__ = ["Starter", "ready_poll_gap", "READY_POLL_MIN_S", "READY_POLL_MIN_FACTORY_S",
           "READY_POLL_RATIO", "READY_POLL_MAX_S", "READY_POLL_FALLBACK_S", "READY_POLL_IN_FLIGHT",
           "EXIT_WAIT_S"]

log = logging.getLogger(LOGGER)

# Each poll is a process start (an interpreter's: 20-40 ms of CPU, from the factory or not).
# A poll catches readiness up to one gap late, so the gap grows with the time already waited:
# tight while a service that loads fast would be missed by much (the runner that waits for it
# starts in ~20 ms), a tenth of the wait after that (caught within 1.1x of its own load time,
# plus one op's run), at most READY_POLL_MAX_S for one that loads for minutes: 70 polls in its
# first minute, then 6 a minute (~0.3 % of a core; a fixed 25 ms after each poll's end made
# several hundred a minute). A service that said `ready` on its channel in an earlier run says
# it again: the same schedule, never under READY_POLL_FALLBACK_S (it is only a fallback).
READY_POLL_MIN_FACTORY_S = 0.02
READY_POLL_MIN_S = 0.05
READY_POLL_RATIO = 0.1
READY_POLL_MAX_S = 10.0
READY_POLL_FALLBACK_S = 1.0
# Polls from the factory may overlap: an op's own run (50-90 ms at load average 10 on two
# cores) is not added to the gap, so a poll starts on time while the previous one is still
# answering. Three in flight measured no better than two there (they compete for the CPU).
READY_POLL_IN_FLIGHT = {True: 2, False: 1}  # by "started from the process factory"


# Polls cancelled once another answered true, until they have ended their groups.
_ending: set[asyncio.Task[bool]] = set()


def ready_poll_gap(waited_s: float, *, factory: bool, says_ready: bool) -> float:
    """Seconds from one `ready` poll's start to the next's, ``waited_s`` after the first (the
    hello); ``says_ready``: it said `ready` on its channel in an earlier run."""
    floor = READY_POLL_MIN_FACTORY_S if factory else READY_POLL_MIN_S
    if says_ready:
        floor = READY_POLL_FALLBACK_S
    return min(max(floor, waited_s * READY_POLL_RATIO), READY_POLL_MAX_S)


# A channel closed before the hello: how long the daemon may take to end (and to write why)
# before the start's group is ended, so its last log line can be quoted.
EXIT_WAIT_S = 2.0


class Starter:
    """The start effect, until READY (or a failure's teardown)."""

    def __init__(self, node: NodeInfo, registry: procs.ProcessRegistry, *, channels: Channels,
                 states: ServiceStates, stopper: Stopper) -> None:
        self.node = node
        self.registry = registry
        self.channels = channels  # endpoint channels, shared with the broker
        self.states = states
        self.stopper = stopper  # a failed or cancelled start's teardown
        # True only under the test-only fault OARBANK_AGENT_FAULT=bare_start_errors: an effect
        # (the error text), not a decision.
        self.bare_start_errors = False

    async def start(self, rt: ServiceRuntime) -> bool:
        """Start ``rt`` (STOPPED or BACKOFF). True: it is READY, to be watched (on
        ``rt.channel``); False: it failed (BACKOFF or WITHDRAWN) or a hold cancelled it
        (STOPPED). Cancelled by the shutdown, it is stopped, then the cancel goes on."""
        rt.starts += 1
        if rt.st.state is lc.State.BACKOFF:
            rt.restarts += 1
        # STOPPED|BACKOFF -> STARTING
        self.states.transition(rt, lc.Event.START)
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
            if ch is not None and res.group is not None:
                ch.owns = res.group.owns  # the hello's pid is checked by it (Windows)
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
                return True  # said ready on the channel just as the deadline passed: it made it
            rt.cancellable = False  # a hold arriving now finds it failed, not starting
            error = str(exc) if isinstance(exc, StartFailed) else (
                advice.no_hello(rt.svc.start_timeout_s) if ch and not ch.hello.done() else
                f"not ready within start_timeout_s={rt.svc.start_timeout_s:g} (ready never true)")
            await self.stopper.teardown(rt, run_stop=False)
            # STARTING -> BACKOFF | WITHDRAWN
            self.states.transition(rt, lc.Event.FAILED, error=error)
            return False
        except asyncio.CancelledError:
            # Shutdown, or a hold, while starting: the full stop order, then STOPPED. A hold
            # is not a failure: nothing is counted against the restart policy.
            held, rt.cancelled_for, rt.cancellable = rt.cancelled_for, None, False
            task = asyncio.current_task()
            if held is not None and task is not None and hasattr(task, "uncancel"):
                task.uncancel()  # handled here: the teardown's own timeouts stay exact
            # STARTING -> STOPPING
            self.states.transition(rt, lc.Event.STOP, reason=held or "shutdown")
            await self.stopper.teardown(rt, run_stop=True)
            # STOPPING -> STOPPED
            self.states.transition(rt, lc.Event.STOPPED)
            if held is None or self.states.shutting_down:
                raise
            log.info("%s: start cancelled by the hold %s", rt.key, held)
            return False
        rt.cancellable = False
        if rt.st.state is lc.State.STARTING:
            # STARTING -> READY (ready op true, or said before we waited; hello; channel open)
            self.states.transition(rt, lc.Event.READY)
        return True

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
        waiting for it are woken from here (``states.transition``), not when the start task runs
        again. Said earlier (the `start` op still running), the start finds it said."""
        self._ready_now(rt, ch, said=True)

    def _ready_now(self, rt: ServiceRuntime, ch: Channel, *, said: bool) -> None:
        """READY in this loop turn, while the start waits for readiness (said on the channel,
        or a poll's answer): the start task finds it so when it runs again."""
        if not (rt.awaiting_ready and rt.channel is ch and ch.is_open
                and rt.st.state is lc.State.STARTING):
            return
        rt.awaiting_ready = False
        if said:
            rt.says_ready = True
        rt.cancellable = False  # a hold arriving now stops a ready service, as for any other
        # STARTING -> READY (said on the channel or the op true, hello, channel open)
        self.states.transition(rt, lc.Event.READY)

    async def _poll_ready(self, rt: ServiceRuntime, ch: Channel | None) -> None:
        """Poll the `ready` op until it answers true: at once, then each poll started
        ``ready_poll_gap`` after the previous one's start (up to ``READY_POLL_IN_FLIGHT`` at a
        time). Cancelled, it ends the polls in flight (each with its group)."""
        from_factory = factory.current() is not None
        most = READY_POLL_IN_FLIGHT[from_factory]
        first = time.monotonic()
        next_at = first
        polls = 0
        running: set[asyncio.Task[bool]] = set()
        try:
            while True:
                if ch is not None and ch.closed.done():
                    raise StartFailed(ch.closed.result())
                now = time.monotonic()
                if now >= next_at and len(running) < most:
                    running.add(asyncio.create_task(self._ready_once(rt, ch),
                                                    name=f"ready op {rt.key}"))
                    polls += 1
                    next_at = now + ready_poll_gap(now - first, factory=from_factory,
                                                   says_ready=rt.says_ready)
                waits: set[asyncio.Future[Any]] = set(running)
                if ch is not None:
                    waits.add(ch.closed)
                timeout = max(0.0, next_at - now) if len(running) < most else None
                if not waits:
                    await asyncio.sleep(timeout or 0.0)  # the contract's `ready` poll, nothing else
                    continue
                done, _ = await asyncio.wait(waits, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                for task in done & running:
                    running.discard(task)
                    if task.result():
                        log.info("%s: ready op true at poll %d, %.0f ms after the first",
                                 rt.key, polls, (time.monotonic() - first) * 1000)
                        # A poll still in flight ends its group in its own task: the
                        # service is ready now, not once that process is reaped.
                        for other in running:
                            other.cancel()
                            _ending.add(other)
                            other.add_done_callback(_ending.discard)
                        running.clear()
                        return
        finally:
            for task in running:  # cancelled or failed: ended before the caller goes on
                task.cancel()
            if running:
                await asyncio.wait(running)

    async def _ready_once(self, rt: ServiceRuntime, ch: Channel | None) -> bool:
        """One `ready` op: whether it answered true (then, after the hello, READY at once)."""
        res = await ops.run_op(rt.ctx, self.node, rt.svc.name, "ready",
                               timeout_s=ops.OP_TIMEOUTS["ready"], registry=self.registry)
        ready = bool(res.ok and res.doc is not None and res.doc.get("ready") is True)
        if ready and ch is not None and ch.hello.done():
            self._ready_now(rt, ch, said=False)
        return ready

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
