"""The job state machine, pure: no processes, no clock reads, no I/O.

Rules
=====

States::

    (submit) ──> queued ──admit──> admitted ──run──> running ──succeed──> succeeded
                   ^                 │  ^               │ ──fail──────> failed
                   │                 │  └────retry──────┘
                   │               fail (a service it reserves is unavailable: no attempt ran)
                   │                 v
                   │               failed
                   └── requeue | release | recover ── admitted | running

    queued | admitted | running ──cancel──> cancelled   (a portal job the node lost)

- A job is created ``queued``, on disk before ``submit`` is answered (``store.py``).
- ``admit``: admission took its pool tokens (FIFO per pool, ``admission.py``).
- ``run``: every endpoint service it reserves is ready; an attempt starts (``attempts`` + 1).
- ``retry``: the runner exited 75 (transient) and attempts are left; the tokens are kept, so
  the job goes back to ``admitted``, not to the queue.
- ``succeed`` / ``fail``: the last attempt's outcome (``runner.classify``); ``fail`` also from
  ``admitted`` when a service it needs can never become ready (``service_unavailable``), and
  from ``queued`` when its module is removed from the node (``module_removed``).
- ``requeue``: the agent is stopping; the record stays ``queued`` so a restarted agent resumes
  it.
- ``release``: host protection (or its service being held or withdrawn) ended the attempt: back
  to the queue ahead of later jobs, the attempt not charged. Also an attempt that ended
  unsuccessfully while a service it reserves died under it (``after_attempt``): the failure
  was the service's, not the job's; it waits in the queue for the restart. Bounded: after
  ``max_attempts`` such releases (a job that kills its service each time) attempts are charged
  again, so such a job ends.
- ``recover``: a restarted agent found the job unfinished (any non-final state) and queues it
  again; an interrupted attempt is given back (``recovery.uncharge_interrupted``).
- ``collect``: a restarted agent found that the interrupted attempt finished after all (its
  runner's files prove it: ``collect.py``): the job is ``running`` again, as it was, and the
  attempt's outcome follows as ``succeed``, ``fail`` or ``retry`` (then ``recover``).
- ``cancel``: a job granted by the portal (fleet dispatch, contract 10.6) that the node must
  stop: its lease was lost, a later grant exists, or its submitter cancelled it. Its runner
  is ended and nothing is reported; the job is the portal's to run elsewhere.
- ``succeeded``, ``failed`` and ``cancelled`` are final: no event leaves them.

The effect layer (``run.py``, ``agent.py``) performs the transition, labels it with a
comment where it happens, and asks ``apply`` for the new state. ``TRANSITIONS`` is the whole
table; ``apply`` refuses anything else.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

__all__ = [
    "State",
    "Event",
    "TRANSITIONS",
    "TERMINAL",
    "IllegalTransition",
    "apply",
    "after_attempt",
    "expired",
]


class State(str, Enum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # a portal job the node had to stop (fleet dispatch)


class Event(str, Enum):
    ADMIT = "admit"  # admission took its tokens
    RUN = "run"  # its services are ready: an attempt starts
    RETRY = "retry"  # the attempt exited 75 and attempts are left (tokens kept)
    SUCCEED = "succeed"  # the last attempt succeeded
    FAIL = "fail"  # the last attempt failed, or a service it needs is unavailable
    REQUEUE = "requeue"  # the agent is stopping: resumed by the next agent on the state dir
    RELEASE = "release"  # host protection ended it: requeued ahead, not charged
    RECOVER = "recover"  # a restarted agent found it unfinished
    COLLECT = "collect"  # ... and its interrupted attempt finished: its outcome follows
    CANCEL = "cancel"  # the portal took the job back (its lease lost, or cancelled)


# (state, event) -> state. Anything not here is a bug in the effect layer.
TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.QUEUED, Event.ADMIT): State.ADMITTED,
    (State.ADMITTED, Event.RUN): State.RUNNING,
    (State.RUNNING, Event.RETRY): State.ADMITTED,
    (State.RUNNING, Event.SUCCEED): State.SUCCEEDED,
    (State.RUNNING, Event.FAIL): State.FAILED,
    (State.ADMITTED, Event.FAIL): State.FAILED,
    (State.QUEUED, Event.FAIL): State.FAILED,  # its module was removed (module remove)
    (State.ADMITTED, Event.REQUEUE): State.QUEUED,
    (State.RUNNING, Event.REQUEUE): State.QUEUED,
    (State.ADMITTED, Event.RELEASE): State.QUEUED,
    (State.RUNNING, Event.RELEASE): State.QUEUED,
    # The previous agent's record may say any unfinished state (a queued one is rewritten
    # as queued: the restart always saves it again).
    (State.QUEUED, Event.RECOVER): State.QUEUED,
    (State.ADMITTED, Event.RECOVER): State.QUEUED,
    (State.RUNNING, Event.RECOVER): State.QUEUED,
    # The record may lag the attempt it shows (a save lost to the kill): any unfinished state.
    (State.QUEUED, Event.COLLECT): State.RUNNING,
    (State.ADMITTED, Event.COLLECT): State.RUNNING,
    (State.RUNNING, Event.COLLECT): State.RUNNING,
    (State.QUEUED, Event.CANCEL): State.CANCELLED,
    (State.ADMITTED, Event.CANCEL): State.CANCELLED,
    (State.RUNNING, Event.CANCEL): State.CANCELLED,
}

# Final states: what `wait` waits for, what a restart leaves alone.
TERMINAL: tuple[str, ...] = (State.SUCCEEDED.value, State.FAILED.value,
                             State.CANCELLED.value)


class IllegalTransition(RuntimeError):
    """``apply`` was given an event the table has no row for: a bug in the effect layer."""


def apply(state: State | str, event: Event) -> State:
    """The state after ``event``. ``state`` may be the record's string. Raises
    ``IllegalTransition`` for a pair not in the table (also for an unknown state string)."""
    try:
        current = State(state)
    except ValueError:
        raise IllegalTransition(f"unknown job state {state!r}") from None
    target = TRANSITIONS.get((current, event))
    if target is None:
        raise IllegalTransition(f"job in state {current.value!r} cannot take {event.value!r}")
    return target


def after_attempt(outcome: str, fault: str | None, attempts: int, max_attempts: int,
                  services_died: list[str], service_releases: int) -> Event:
    """What the end of a running attempt does to its job. ``outcome``: ``runner.classify``'s
    state (succeeded, retry, failed); ``fault``: its ``job | host | transient`` or None (a
    runner that died without saying); ``attempts``: charged so far, this one included;
    ``services_died``: services the job reserves that died while it ran; ``service_releases``:
    earlier releases of this job for that reason.

    A success stands whatever happened to the service, and so does a failure that is the job's
    own (exit 2, a timeout): the service's death did not cause it. Any other failure under a
    dead service is released (not charged), unless the job was already released
    ``max_attempts`` times for it: then it is charged like any other failure."""
    if outcome == "succeeded":
        return Event.SUCCEED
    if services_died and fault != "job" and service_releases < max_attempts:
        return Event.RELEASE
    if outcome == "retry" and attempts < max_attempts:
        return Event.RETRY
    return Event.FAIL


def expired(records: Iterable[tuple[str, str, float | None]], now: float,
            keep_s: float) -> list[str]:
    """The jobs whose records are removed now: ``(job id, state, finished_at)`` of a final job
    that finished more than ``keep_s`` seconds before ``now`` (unix seconds). Unfinished jobs
    are never removed, whatever their age: the state dir is bounded by what it still owes."""
    return [job_id for job_id, state, finished_at in records
            if state in TERMINAL and finished_at is not None and now - finished_at > keep_s]
