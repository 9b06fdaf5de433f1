"""The service state machine (contract section 2), pure: no processes, no clock reads, no I/O.

Rules
=====

States::

    stopped ──start──> starting ──ready──> ready ──stop──> stopping ──stopped──> stopped
       ^                  │                  │                 │
       │                failed             failed            (stop failures still end at
       │                  v                  v                  `stopped`: the group is gone)
       └──(shutdown)──── backoff <───────────┘
                          │ failures reach max_failures
                          v
                      withdrawn   (pools count 0, nothing admitted, never started) ──recover──> stopped
                                   a healthy `fingerprint` once the backoff delay has passed
    stopped ──adopt──> ready   (agent restart: a non-endpoint service found running)

- A service is *wanted* when its lifecycle is ``always`` or it has users (admitted jobs holding
  one of its pools). ``manual`` services are never wanted: the agent only fingerprints them.
- ``start`` happens from ``stopped`` when wanted, and from ``backoff`` when wanted and the
  backoff delay has passed.
- A failure (start error or timeout, ready never true, the service closing its channel, its
  process group dying) counts one failure. The next start waits
  ``backoff_initial_s * 2 ** (failures - 1)`` seconds, capped at ``backoff_max_s``. At
  ``max_failures`` the service is withdrawn.
- Only becoming ready resets the failure count; a clean stop does not. A withdrawn service is
  probed (``fingerprint``) once ``backoff_delay(failures)`` has passed, and again after each
  unhealthy answer; a healthy one un-withdraws it (``recover``, to ``stopped``) with its failure
  count kept, so a single further failure withdraws it again.
- ``adopt``: after an agent restart a non-endpoint service whose ``fingerprint`` says running is
  taken as it is (ready), never started twice. Endpoint services are never adopted.
- ``on_demand``: a ready service with zero users for ``idle_timeout_s`` is stopped (reason
  ``idle``). The idle clock starts when users drop to zero and is cleared when one arrives.
- On agent shutdown every running or starting service is stopped and a backing-off one is
  simply forgotten (it has no process).
- *Held* (host protection: ``preempt_memory`` / ``preempt_protection``): a held service is never
  started, a ready one is stopped with the hold as its reason, and a start in flight is
  cancelled (``cancel``: the full stop order, no failure counted). Its pools count 0. Shutdown
  decisions come first: a hold changes nothing while the agent stops.
- *GPU missing* (``GPU_API_MISSING``): the host lacks every API of its ``apis_any``; it is never
  started and its pools count 0.
- *Disabled* (``oarbank-agent module disable``): never started, a start in flight cancelled,
  its pools count 0; a ready one is stopped (reason ``disabled``) once it has no users, so the
  attempts that use it finish (``--now`` releases them first: the users drop to 0).
- *Offered*: its pools count (capacities from its fingerprint) unless it is withdrawn, held or
  GPU-missing. *Hopeless*: a job waiting for it would wait forever (shutting down, manual,
  held, GPU-missing or withdrawn), so nobody waits.
- *Evicted* (demand eviction, ``protection/eviction.py``): an idle ready service asked to make
  room for a waiting job (``evict_for``: which job, of which module) is stopped with reason
  ``evicted``; that text stays readable (``stopped_for``) until its next start. A user
  arriving first cancels the request. ``always`` services are never evicted.
- Test-only faults (``faults.py``) are inputs too: ``idle_stop`` false (``no_idle_stop``) means
  an idle service is never stopped and no idle timer is set; ``flat_backoff`` means every
  delay is ``backoff_initial_s``.

Everything a decision reads is in ``ServiceState``: the lifecycle's counters and clocks, and
the inputs from outside (users, held, gpu_missing, shutting_down, the faults), each set by one
function here. The effect layer (``supervisor``) asks ``decide`` what to do, performs it, and
reports what happened with ``apply``. ``TRANSITIONS`` is the whole table (a failure's target
depends on the count: a ``Branch``); ``apply`` refuses anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

DISABLED = "disabled"  # the stop reason of a service whose module was disabled
EVICTED = "evicted"  # the stop reason of an idle service stopped to make room for a job

__all__ = [
    "State",
    "Event",
    "Branch",
    "TRANSITIONS",
    "ServiceState",
    "Decision",
    "IllegalTransition",
    "backoff_delay",
    "target",
    "apply",
    "decide",
    "hold_override",
    "set_users",
    "set_held",
    "set_disabled",
    "DISABLED",
    "EVICTED",
    "set_evict",
    "set_gpu_missing",
    "shut_down",
    "with_faults",
    "offered",
    "hopeless",
]


class State(str, Enum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    BACKOFF = "backoff"
    WITHDRAWN = "withdrawn"


class Event(str, Enum):
    START = "start"  # the supervisor begins a start (channel + `start` op)
    READY = "ready"  # `ready` true AND hello AND channel open
    FAILED = "failed"  # any service failure; its processes have been ended
    STOP = "stop"  # the supervisor begins the stop order
    STOPPED = "stopped"  # the stop order has finished; nothing of the service is left
    FORGET = "forget"  # a backing-off service that is no longer wanted (or at shutdown)
    PROBED = "probed"  # a withdrawn service's fingerprint was not healthy: probe again later
    RECOVER = "recover"  # a withdrawn service's fingerprint was healthy: it may start again
    ADOPT = "adopt"  # agent restart: a running non-endpoint service is taken over as ready


@dataclass(frozen=True)
class Branch:
    """A target that depends on the counters: ``then`` when the failure being recorded brings
    ``failures`` to ``max_failures``, else ``otherwise``."""

    then: State
    otherwise: State
    when: str = "failures reach max_failures"


# A failure is one more failure: at max_failures it withdraws the service, else it backs off.
_FAILED = Branch(then=State.WITHDRAWN, otherwise=State.BACKOFF)

# (state, event) -> state (or a Branch on the failure count).
TRANSITIONS: dict[tuple[State, Event], State | Branch] = {
    (State.STOPPED, Event.START): State.STARTING,
    (State.BACKOFF, Event.START): State.STARTING,
    (State.STARTING, Event.READY): State.READY,
    (State.STARTING, Event.FAILED): _FAILED,
    (State.READY, Event.FAILED): _FAILED,
    (State.STARTING, Event.STOP): State.STOPPING,
    (State.READY, Event.STOP): State.STOPPING,
    (State.STOPPING, Event.STOPPED): State.STOPPED,
    (State.BACKOFF, Event.FORGET): State.STOPPED,
    (State.WITHDRAWN, Event.PROBED): State.WITHDRAWN,
    (State.WITHDRAWN, Event.RECOVER): State.STOPPED,
    (State.STOPPED, Event.ADOPT): State.READY,
}


class IllegalTransition(RuntimeError):
    """``apply`` was given an event the table has no row for: a bug in the effect layer."""


@dataclass(frozen=True)
class ServiceState:
    lifecycle: str  # on_demand | always | manual
    idle_timeout_s: float
    backoff_initial_s: float
    backoff_max_s: float
    max_failures: int
    state: State = State.STOPPED
    failures: int = 0
    users: int = 0
    idle_since: float | None = None  # when users last dropped to zero while up
    retry_at: float | None = None  # backoff: earliest next start
    error: str | None = None  # the last failure, readable
    stopped_reason: str | None = None  # why the last stop happened (idle, shutdown, ...)
    # Inputs from outside the service (rules above), each set by one function below.
    held: str | None = None  # host protection keeps it down, with this reason
    disabled: bool = False  # its module is disabled on this node (module disable)
    gpu_missing: str | None = None  # the GPU_API_MISSING text: never started on this node
    evict_for: str | None = None  # demand eviction asks it to stop for this (job, module)
    stopped_for: str | None = None  # what its last stop (``evicted``) made room for
    shutting_down: bool = False  # the agent is stopping
    idle_stop: bool = True  # False only under the test fault no_idle_stop
    flat_backoff: bool = False  # True only under the test fault flat_backoff


@dataclass(frozen=True)
class Decision:
    """What the supervisor should do now. ``action`` is one of ``none``, ``start``, ``stop``,
    ``forget``, ``probe`` (fingerprint a withdrawn service), ``cancel`` (a start in flight,
    for a hold: ``reason``); ``wake_at`` is when to ask again if nothing else happens (a
    timer)."""

    action: str = "none"
    reason: str | None = None
    wake_at: float | None = None


def backoff_delay(failures: int, initial_s: float, max_s: float) -> float:
    """Delay before the next start after ``failures`` consecutive failures (>= 1)."""
    if failures <= 0:
        return 0.0
    # Cap the exponent too: 2**10000 is a float overflow, and the cap wins long before that.
    return float(min(max_s, initial_s * 2 ** min(failures - 1, 64)))


def _delay(s: ServiceState, failures: int) -> float:
    # flat_backoff (test fault): the cap is the first delay, so the delay never grows.
    cap = s.backoff_initial_s if s.flat_backoff else s.backoff_max_s
    return backoff_delay(failures, s.backoff_initial_s, cap)


def target(s: ServiceState, event: Event) -> State:
    """The state ``event`` leads to from ``s`` (the table's row, its branch resolved). Raises
    ``IllegalTransition`` for a pair not in the table."""
    row = TRANSITIONS.get((s.state, event))
    if row is None:
        raise IllegalTransition(f"service in state {s.state.value!r} cannot take {event.value!r}")
    if isinstance(row, Branch):
        # The only branch: the failure being recorded counts (s.failures + 1).
        return row.then if s.failures + 1 >= s.max_failures else row.otherwise
    return row


def apply(s: ServiceState, event: Event, now: float, *, error: str | None = None,
          reason: str | None = None) -> ServiceState:
    """The state after ``event``. Raises ``IllegalTransition`` for a pair not in the table."""
    to = target(s, event)
    if event is Event.FAILED:
        failures = s.failures + 1
        # BACKOFF: retry_at is the next start; WITHDRAWN: when a fingerprint may un-withdraw it
        return replace(s, state=to, failures=failures, retry_at=now + _delay(s, failures),
                       error=error, idle_since=None)
    if event is Event.PROBED:
        return replace(s, retry_at=now + _delay(s, s.failures))
    if event is Event.RECOVER:
        # The failure count is kept: only becoming ready resets it. The last error stays
        # readable until then.
        return replace(s, state=to, retry_at=None, stopped_reason="withdrawn")
    if event in (Event.READY, Event.ADOPT):
        # Only becoming ready resets the failure count.
        return replace(s, state=to, failures=0, error=None, retry_at=None,
                       idle_since=None if s.users else now, stopped_reason=None)
    if event is Event.START:
        return replace(s, state=to, retry_at=None, stopped_reason=None, stopped_for=None,
                       evict_for=None)
    if event is Event.STOP:
        return replace(s, state=to, stopped_reason=reason, evict_for=None,
                       stopped_for=s.evict_for if reason == EVICTED else None)
    if event is Event.STOPPED:
        return replace(s, state=to, idle_since=None, evict_for=None)
    if event is Event.FORGET:
        return replace(s, state=to, retry_at=None)
    return replace(s, state=to)  # pragma: no cover - every event is handled above


def set_timings(s: ServiceState, *, idle_timeout_s: float, backoff_initial_s: float,
                backoff_max_s: float, max_failures: int) -> ServiceState:
    """New timings (the config file's overrides, at start or on reload). The idle clock and
    a pending retry keep their start: the next ``decide`` measures them with the new values."""
    return replace(s, idle_timeout_s=idle_timeout_s, backoff_initial_s=backoff_initial_s,
                   backoff_max_s=backoff_max_s, max_failures=max_failures)


def set_users(s: ServiceState, users: int, now: float) -> ServiceState:
    """New user count; starts the idle clock when it drops to zero, clears it when one comes."""
    if users > 0:  # a user first: an eviction asked meanwhile is off
        return replace(s, users=users, idle_since=None, evict_for=None)
    if s.users > 0 or s.idle_since is None:
        return replace(s, users=0, idle_since=now)
    return replace(s, users=0)


def resume_idle(s: ServiceState, since: float) -> ServiceState:
    """A service kept across an agent restart (``--keep-services``) with no users: its idle
    clock runs on from when the previous agent saw its last user leave."""
    return replace(s, idle_since=since) if s.users == 0 else s


def set_held(s: ServiceState, reason: str | None) -> ServiceState:
    """Host protection holds it down (``reason``) or lifts its hold (None)."""
    return replace(s, held=reason)


def set_evict(s: ServiceState, for_what: str | None) -> ServiceState:
    """Demand eviction asks an idle service to stop for ``for_what`` (None: no longer)."""
    return replace(s, evict_for=for_what)


def set_disabled(s: ServiceState, disabled: bool) -> ServiceState:
    """Its module is disabled (True) or enabled again (False) on this node."""
    return replace(s, disabled=disabled)


def set_gpu_missing(s: ServiceState, text: str | None) -> ServiceState:
    """The host lacks its GPU API (the GPU_API_MISSING text), or has one (None)."""
    return replace(s, gpu_missing=text)


def shut_down(s: ServiceState) -> ServiceState:
    """The agent is stopping: from now on every decision is a shutdown decision."""
    return replace(s, shutting_down=True)


def with_faults(s: ServiceState, *, idle_stop: bool = True,
                flat_backoff: bool = False) -> ServiceState:
    """Test-only fault injection (faults.py): ``no_idle_stop``, ``flat_backoff``."""
    return replace(s, idle_stop=idle_stop, flat_backoff=flat_backoff)


def offered(s: ServiceState) -> bool:
    """Whether its pools count on this node now (its fingerprint's capacities)."""
    return not (s.state is State.WITHDRAWN or s.held is not None or s.gpu_missing is not None
                or s.disabled)


def hopeless(s: ServiceState) -> bool:
    """Whether waiting for it to become ready is pointless: nothing will start it."""
    return (s.shutting_down or s.lifecycle == "manual" or s.held is not None
            or s.gpu_missing is not None or s.state is State.WITHDRAWN or s.disabled)


def wanted(s: ServiceState) -> bool:
    if s.lifecycle == "manual":
        return False
    return s.lifecycle == "always" or s.users > 0


def decide(s: ServiceState, now: float, *, shutting_down: bool = False) -> Decision:
    """What to do with a service now. Pure: the same inputs give the same answer.

    ``shutting_down`` may also be given here (it adds to the state's own)."""
    shutting_down = shutting_down or s.shutting_down
    if s.state is State.STARTING and s.held is not None:
        return Decision("cancel", reason=s.held)  # a hold cancels a start in flight
    if s.state is State.STARTING and s.disabled and not shutting_down:
        return Decision("cancel", reason=DISABLED)  # so does disabling its module
    d = _lifecycle_decision(s, now, shutting_down)
    if not shutting_down:
        d = hold_override(s.state, d, held=s.held, gpu_missing=s.gpu_missing is not None,
                          shutting_down=False)
        if s.disabled and d.action == "start":
            d = Decision()  # stays down until its module is enabled (that pokes it)
        elif s.disabled and s.state is State.READY and s.users == 0 and d.action != "stop":
            d = Decision("stop", reason=DISABLED)  # its last attempt is over
    if d.action == "stop" and d.reason == "idle" and not s.idle_stop:
        return Decision()  # fault injection (no_idle_stop, test only): stays READY, no timer
    return d


def hold_override(state: State, decision: Decision, *, held: str | None,
                  gpu_missing: bool, shutting_down: bool) -> Decision:
    """Host protection on top of the lifecycle's decision.

    A held service (``preempt_memory`` / ``preempt_protection``) is never started, and one
    that is up is stopped with the hold as its reason; a service whose GPU API is missing is
    never started. Shutdown decisions pass through unchanged.
    """
    if shutting_down:
        return decision
    if held is not None and state is State.READY:
        return Decision("stop", reason=held)
    if (held is not None or gpu_missing) and decision.action == "start":
        return Decision()  # stays down; a lifted hold pokes it again
    return decision


def _lifecycle_decision(s: ServiceState, now: float, shutting_down: bool) -> Decision:
    """The lifecycle's own rules (wanted, backoff, withdrawn, idle, shutdown)."""
    if s.state in (State.STARTING, State.STOPPING):
        return Decision()  # an effect is in flight
    if s.lifecycle == "manual":
        return Decision()
    if s.state is State.WITHDRAWN:
        if shutting_down or s.retry_at is None:
            return Decision()
        if now >= s.retry_at:
            return Decision("probe")
        return Decision(wake_at=s.retry_at)
    if shutting_down:
        if s.state is State.READY:
            return Decision("stop", reason="shutdown")
        if s.state is State.BACKOFF:
            return Decision("forget", reason="shutdown")
        return Decision()
    want = wanted(s)
    if s.state is State.STOPPED:
        return Decision("start") if want else Decision()
    if s.state is State.BACKOFF:
        if not want:
            # Stay backing off: a user arriving later still waits out the delay.
            return Decision()
        retry_at = s.retry_at if s.retry_at is not None else now
        if now >= retry_at:
            return Decision("start")
        return Decision(wake_at=retry_at)
    # READY
    if s.lifecycle != "always" and s.users == 0 and s.evict_for is not None:
        return Decision("stop", reason=EVICTED)
    if s.lifecycle == "on_demand" and s.users == 0:
        since = s.idle_since if s.idle_since is not None else now
        due = since + s.idle_timeout_s
        if now >= due:
            return Decision("stop", reason="idle")
        return Decision(wake_at=due)
    return Decision()
