"""The supervisor: what the rest of the agent talks to about services (contract section 2).

A facade over parts that each do one thing, given to each other at construction:

- ``states.py`` (``ServiceStates``): every service's runtime and state, the transitions
  (logged, waiters woken, listeners told) and the waits on readiness;
- ``prober.py`` (``Prober``): the ``fingerprint`` op, and a withdrawn service's probe;
- ``stopper.py`` (``Stopper``): the stop order and the stop and failure effects;
- ``starter.py`` (``Starter``): the start, until ready;
- ``readywatch.py`` (``ReadyWatch``): a ready service failing on its own;
- ``driver.py`` (``LifecycleDriver``): performs what ``lifecycle.decide`` says, feeds it its
  inputs, adopts, lets go and shuts down.

This class adds only the views (``capacities``, ``row``). It is the broker's ``ServiceGate``
(``ready_now``, ``wait_ready``); it opens channels in the ``Channels`` table it shares with
the broker (given at construction: neither holds the other).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oarbank_agent import procs
from oarbank_agent.modules.loaded import ModuleCtx, NodeInfo
from oarbank_agent.sandbox import refusals
from oarbank_agent.services import detachedwatch
from oarbank_agent.services import lifecycle as lc
from oarbank_agent.services.driver import LifecycleDriver
from oarbank_agent.services.loadstats import LoadStats
from oarbank_agent.services.prober import Prober
from oarbank_agent.services.readywatch import ReadyWatch
from oarbank_agent.services.runtime import ServiceRuntime, row
from oarbank_agent.services.starter import Starter
from oarbank_agent.services.states import ServiceStates
from oarbank_agent.services.stopper import Stopper
from oarbank_sdk import manifest as mf

if TYPE_CHECKING:
    from oarbank_agent.broker.channel import Channel, Channels
    from oarbank_agent.platform.api import Group

__all__ = ["Supervisor"]


class Supervisor:
    """One per agent: its services, their inputs, the readiness the broker and jobs wait on."""

    def __init__(self, node: NodeInfo, registry: procs.ProcessRegistry, *,
                 channels: Channels, status_poll_s: float = detachedwatch.DEFAULT_FIRST_S) -> None:
        self.node = node
        self.registry = registry
        self.channels = channels  # endpoint channels, shared with the broker
        self.states = ServiceStates(LoadStats(node.state_dir))
        self.prober = Prober(node, registry, self.states)
        self.stopper = Stopper(node, registry, self.states, self.prober)
        self.starter = Starter(node, registry, channels=channels, states=self.states,
                               stopper=self.stopper)
        self.driver = LifecycleDriver(
            self.states, starter=self.starter, stopper=self.stopper, prober=self.prober,
            watch=ReadyWatch(node, registry, status_poll_s=status_poll_s))
        # The states' own dict and lists, read and listened to by the agent's other parts.
        self.services = self.states.services
        self.stats = self.states.stats
        self.on_change = self.states.on_change
        self.on_capacity = self.states.on_capacity

    @property
    def shutting_down(self) -> bool:
        return self.states.shutting_down

    @property
    def bare_start_errors(self) -> bool:
        """The test-only fault ``bare_start_errors`` (the starter's error text)."""
        return self.starter.bare_start_errors

    @bare_start_errors.setter
    def bare_start_errors(self, on: bool) -> None:
        self.starter.bare_start_errors = on

    def add_module(self, ctx: ModuleCtx) -> list[ServiceRuntime]:
        return self.states.add_module(ctx)

    # --- views ----------------------------------------------------------------------------

    def capacities(self, key: str) -> dict[str, int]:
        """pool name -> tokens this service offers now (0 unless ``lifecycle.offered``)."""
        rt = self.services[key]
        on = lc.offered(rt.st)  # withdrawn, held or no GPU API: its pools count 0
        return {p: (max(0, int(rt.fp_pools.get(p, 0))) if on else 0) for p in rt.svc.pools}

    def row(self, rt: ServiceRuntime) -> dict[str, Any]:
        """Contract section 6 row (``row`` with what the sandbox refused this service)."""
        return row(rt, refusals.current().describe(rt.key))

    async def fingerprint(self, rt: ServiceRuntime) -> None:
        await self.prober.fingerprint(rt)

    # --- the readiness gate (states.py) ---------------------------------------------------

    def ready_now(self, service_key: str) -> bool:
        return self.states.ready_now(service_key)

    async def wait_ready(self, service_key: str) -> bool:
        return await self.states.wait_ready(service_key)

    async def await_ready(self, service_key: str) -> bool:
        return await self.states.await_ready(service_key)

    # --- the lifecycle's inputs and its entries and exits (driver.py) ---------------------

    def poke(self, rt: ServiceRuntime) -> None:
        self.driver.poke(rt)

    def set_users(self, key: str, users: int) -> None:
        self.driver.set_users(key, users)

    def set_hold(self, key: str, reason: str | None) -> bool:
        return self.driver.set_hold(key, reason)

    def evict(self, key: str, for_what: str) -> None:
        self.driver.evict(key, for_what)

    def set_disabled(self, key: str, disabled: bool, *, live: bool = True) -> bool:
        return self.driver.set_disabled(key, disabled, live=live)

    def set_timings(self, key: str, svc: mf.Service, *, live: bool = True) -> None:
        self.driver.set_timings(key, svc, live=live)

    def set_gpu_missing(self, key: str, text: str | None) -> None:
        self.driver.set_gpu_missing(key, text)

    def set_faults(self, *, idle_stop: bool, flat_backoff: bool) -> None:
        self.driver.set_faults(idle_stop=idle_stop, flat_backoff=flat_backoff)

    def adopt(self, rt: ServiceRuntime, group: Group | None) -> None:
        self.driver.adopt(rt, group)

    def adopt_endpoint(self, rt: ServiceRuntime, ch: Channel, group: Group | None,
                       idle_since: float | None) -> None:
        self.driver.adopt_endpoint(rt, ch, group, idle_since)

    def let_go(self, rt: ServiceRuntime) -> None:
        self.driver.let_go(rt)

    async def shutdown(self) -> None:
        await self.driver.shutdown()
