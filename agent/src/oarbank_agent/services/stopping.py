"""Stopping a service, and a ready one failing on its own: the watch (channel closed, group
gone, or the sparse ``status``), the failure's teardown, the withdrawn service's probe, adoption
after an agent restart, the stop order (``stop`` op, close the channel, end the group) and the
agent's shutdown.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from oarbank_agent import platform, procs
from oarbank_agent.sandbox import escapewatch
from oarbank_agent.services import detachedwatch, ops
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services.runtime import ServiceRuntime
from oarbank_agent.services.supervisor_base import SupervisorBase, log

if TYPE_CHECKING:
    from oarbank_agent.broker.channel import Channel
    from oarbank_agent.platform.api import Group

__all__ = ["Stopping", "GROUP_GRACE_S", "ESCALATE_GRACE_S"]

GROUP_GRACE_S = 5.0  # terminate -> kill for a service's group at the end of the stop order
# A `stop` op that overran stop_timeout_s has had its chance: the group gets a short grace.
ESCALATE_GRACE_S = 2.0


class Stopping(SupervisorBase):
    """Stops, failures, probes, adoption, shutdown."""

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

    def adopt_endpoint(self, rt: ServiceRuntime, ch: Channel, group: Group | None,
                       idle_since: float | None) -> None:
        """Agent restart with ``--keep-services``: take back an endpoint service proven the
        one the previous agent kept (``keep/decide.py``), with its kept channel; its idle
        clock goes on from where it was (users come back with the jobs that use it)."""
        rt.channel, rt.group = ch, group
        rt.says_ready = ch.ready_said.done()
        ch.on_ready = None  # it is ready already: a `ready` line now changes nothing
        # STOPPED -> READY (adopted: its channel kept, proven the same process)
        self._transition(rt, lc.Event.ADOPT)
        if rt.st.users == 0 and idle_since is not None:
            rt.st = lc.resume_idle(rt.st, idle_since)
        rt.watch = asyncio.create_task(self._watch(rt, ch), name=f"watch {rt.key}")
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
        self._resolve_waiters(rt, False)
        if rt.channel is not None:
            rt.channel.close()  # our end only: the keeper's copy keeps the channel open
            rt.channel = None
        rt.group = None
        del self.services[rt.key]
        log.info("%s: left running for the next agent (its channel is kept)", rt.key)

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
