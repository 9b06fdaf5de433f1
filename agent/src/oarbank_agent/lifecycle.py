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

The effect layer (``supervisor``) asks ``decide`` what to do, performs it, and reports what
happened with ``apply``. ``TRANSITIONS`` is the whole table; ``apply`` refuses anything else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

__all__ = [
    "State",
    "Event",
    "TRANSITIONS",
    "ServiceState",
    "Decision",
    "IllegalTransition",
    "backoff_delay",
    "apply",
    "decide",
    "set_users",
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


# (state, event) -> state. FAILED's target is computed (backoff or withdrawn): marked None.
TRANSITIONS: dict[tuple[State, Event], State | None] = {
    (State.STOPPED, Event.START): State.STARTING,
    (State.BACKOFF, Event.START): State.STARTING,
    (State.STARTING, Event.READY): State.READY,
    (State.STARTING, Event.FAILED): None,
    (State.READY, Event.FAILED): None,
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


@dataclass(frozen=True)
class Decision:
    """What the supervisor should do now. ``action`` is one of ``none``, ``start``, ``stop``,
    ``forget``, ``probe`` (fingerprint a withdrawn service); ``wake_at`` is when to ask again
    if nothing else happens (a timer)."""

    action: str = "none"
    reason: str | None = None
    wake_at: float | None = None


def backoff_delay(failures: int, initial_s: float, max_s: float) -> float:
    """Delay before the next start after ``failures`` consecutive failures (>= 1)."""
    if failures <= 0:
        return 0.0
    # Cap the exponent too: 2**10000 is a float overflow, and the cap wins long before that.
    return float(min(max_s, initial_s * 2 ** min(failures - 1, 64)))


def apply(s: ServiceState, event: Event, now: float, *, error: str | None = None,
          reason: str | None = None) -> ServiceState:
    """The state after ``event``. Raises ``IllegalTransition`` for a pair not in the table."""
    key = (s.state, event)
    if key not in TRANSITIONS:
        raise IllegalTransition(f"service in state {s.state.value!r} cannot take {event.value!r}")
    if event is Event.FAILED:
        failures = s.failures + 1
        delay = backoff_delay(failures, s.backoff_initial_s, s.backoff_max_s)
        if failures >= s.max_failures:
            # retry_at: when a fingerprint may un-withdraw it
            return replace(s, state=State.WITHDRAWN, failures=failures, retry_at=now + delay,
                           error=error, idle_since=None)
        return replace(s, state=State.BACKOFF, failures=failures, retry_at=now + delay,
                       error=error, idle_since=None)
    target = TRANSITIONS[key]
    assert target is not None
    if event is Event.PROBED:
        delay = backoff_delay(s.failures, s.backoff_initial_s, s.backoff_max_s)
        return replace(s, retry_at=now + delay)
    if event is Event.RECOVER:
        # The failure count is kept: only becoming ready resets it. The last error stays
        # readable until then.
        return replace(s, state=target, retry_at=None, stopped_reason="withdrawn")
    if event in (Event.READY, Event.ADOPT):
        # Only becoming ready resets the failure count.
        return replace(s, state=target, failures=0, error=None, retry_at=None,
                       idle_since=None if s.users else now, stopped_reason=None)
    if event is Event.START:
        return replace(s, state=target, retry_at=None, stopped_reason=None)
    if event is Event.STOP:
        return replace(s, state=target, stopped_reason=reason)
    if event is Event.STOPPED:
        return replace(s, state=target, idle_since=None)
    if event is Event.FORGET:
        return replace(s, state=target, retry_at=None)
    return replace(s, state=target)  # pragma: no cover - every event is handled above


def set_users(s: ServiceState, users: int, now: float) -> ServiceState:
    """New user count; starts the idle clock when it drops to zero, clears it when one comes."""
    if users > 0:
        return replace(s, users=users, idle_since=None)
    if s.users > 0 or s.idle_since is None:
        return replace(s, users=0, idle_since=now)
    return replace(s, users=0)


def wanted(s: ServiceState) -> bool:
    if s.lifecycle == "manual":
        return False
    return s.lifecycle == "always" or s.users > 0


def decide(s: ServiceState, now: float, *, shutting_down: bool = False) -> Decision:
    """What to do with a service now. Pure: the same inputs give the same answer."""
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
    if s.lifecycle == "on_demand" and s.users == 0:
        since = s.idle_since if s.idle_since is not None else now
        due = since + s.idle_timeout_s
        if now >= due:
            return Decision("stop", reason="idle")
        return Decision(wake_at=due)
    return Decision()
