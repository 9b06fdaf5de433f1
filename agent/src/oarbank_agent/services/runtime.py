"""A service as the supervisor holds it (``ServiceRuntime``), and what is read from it alone:
``ready``, the contract's status ``row``, the operator's ``details``.

Pure over the runtime; the supervisor's parts change it: ``states.py`` (transitions), the
driver (``driver.py``: the lifecycle's inputs) and the effects (``starter.py``, ``stopper.py``,
``prober.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from oarbank_agent import platform
from oarbank_agent.modules.loaded import ModuleCtx
from oarbank_agent.services import lifecycle as lc
from oarbank_sdk import manifest as mf
from oarbank_sdk.servicerow import ServiceRow

if TYPE_CHECKING:
    from oarbank_agent.broker.channel import Channel
    from oarbank_agent.platform.api import Group

__all__ = ["ServiceRuntime", "StartFailed", "service_key", "ready", "details", "row"]


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
    fp_reserve_gpu_gb: float = 0.0  # fingerprint's reserve.gpu_mem_gb (charged while it runs)
    # the last fingerprint's reserve it cannot account (at load: its module is refused)
    fp_reserve_problem: str | None = None
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
    # now makes the service READY at once (``Starter._ready_said``).
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
    stopped (and, evicted, for which job), starts and restarts (starts after a failure).
    ``now``: unix time."""
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
        # evicted: the job (and its module) it was stopped to make room for
        "evicted_for": s.stopped_for,
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
    doc = ServiceRow(
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
    # Beyond the contract's row (a portal keeps keys it does not know): a service stopped to
    # make room for a job says which; the portal's services query answers `evicted`.
    doc["evicted_for"] = rt.st.stopped_for if not up else None
    return doc
