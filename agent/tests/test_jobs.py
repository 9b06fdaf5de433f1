"""The pure job state machine: every row of the table, and everything else refused."""

from __future__ import annotations

import pytest

from oarbank_agent.jobs import machine as jobs
from oarbank_agent.jobs.machine import Event, State


def run_through(*events: Event, start: State = State.QUEUED) -> State:
    s = start
    for e in events:
        s = jobs.apply(s, e)
    return s


def test_a_job_that_succeeds_first_time() -> None:
    assert run_through(Event.ADMIT, Event.RUN, Event.SUCCEED) is State.SUCCEEDED


def test_retries_keep_the_tokens_and_the_last_attempt_decides() -> None:
    s = run_through(Event.ADMIT, Event.RUN, Event.RETRY)
    assert s is State.ADMITTED  # not back to the queue: the tokens are kept
    assert run_through(Event.RUN, Event.RETRY, Event.RUN, Event.FAIL, start=s) is State.FAILED


def test_a_service_that_never_becomes_ready_fails_the_job_before_any_attempt() -> None:
    assert run_through(Event.ADMIT, Event.FAIL) is State.FAILED


@pytest.mark.parametrize("event", [Event.REQUEUE, Event.RELEASE, Event.RECOVER])
@pytest.mark.parametrize("state", [State.ADMITTED, State.RUNNING])
def test_unfinished_jobs_go_back_to_the_queue(state: State, event: Event) -> None:
    assert jobs.apply(state, event) is State.QUEUED


@pytest.mark.parametrize("state", [State.QUEUED, State.ADMITTED, State.RUNNING])
def test_a_portal_job_the_node_lost_ends_cancelled_from_any_unfinished_state(
        state: State) -> None:
    assert jobs.apply(state, Event.CANCEL) is State.CANCELLED


def test_a_restart_requeues_a_queued_record_too() -> None:
    assert jobs.apply(State.QUEUED, Event.RECOVER) is State.QUEUED


def test_the_record_string_is_accepted() -> None:
    assert jobs.apply("running", Event.SUCCEED) is State.SUCCEEDED
    assert jobs.apply(State.RUNNING, Event.SUCCEED).value == "succeeded"


def test_every_row_of_the_table() -> None:
    for (state, event), target in jobs.TRANSITIONS.items():
        assert jobs.apply(state, event) is target
        assert jobs.apply(state.value, event) is target


def test_everything_not_in_the_table_is_refused() -> None:
    refused = [(s, e) for s in State for e in Event if (s, e) not in jobs.TRANSITIONS]
    # Final states take no event at all; a queued job cannot run or finish without admission.
    assert all((s, e) in refused for s in (State.SUCCEEDED, State.FAILED, State.CANCELLED)
               for e in Event)
    assert (State.QUEUED, Event.RUN) in refused and (State.QUEUED, Event.SUCCEED) in refused
    assert (State.ADMITTED, Event.SUCCEED) in refused and (State.RUNNING, Event.ADMIT) in refused
    for s, e in refused:
        with pytest.raises(jobs.IllegalTransition):
            jobs.apply(s, e)


def test_an_unknown_state_string_is_refused() -> None:
    with pytest.raises(jobs.IllegalTransition):
        jobs.apply("lost", Event.RECOVER)


def test_terminal_states_are_the_final_ones() -> None:
    assert set(jobs.TERMINAL) == {"succeeded", "failed", "cancelled"}
    for s in State:
        leaves = any((s, e) in jobs.TRANSITIONS for e in Event)
        assert leaves == (s.value not in jobs.TERMINAL)


@pytest.mark.parametrize("outcome,fault,attempts,died,releases,expected", [
    ("succeeded", None, 1, ["m/s"], 0, Event.SUCCEED),  # a success stands
    ("retry", "transient", 1, [], 0, Event.RETRY),
    ("retry", "transient", 3, [], 0, Event.FAIL),  # no attempts left
    ("failed", None, 1, [], 0, Event.FAIL),
    ("retry", "transient", 1, ["m/s"], 0, Event.RELEASE),  # its service died: not charged
    ("failed", None, 3, ["m/s"], 2, Event.RELEASE),  # a crash, even on the last attempt
    ("failed", "host", 1, ["m/s"], 0, Event.RELEASE),
    ("failed", "job", 1, ["m/s"], 0, Event.FAIL),  # exit 2 or a timeout: the job's own
    ("retry", "transient", 1, ["m/s"], 3, Event.RETRY),  # released max_attempts times: charged
    ("failed", None, 1, ["m/s"], 3, Event.FAIL),
])
def test_after_an_attempt(outcome, fault, attempts, died, releases, expected) -> None:
    assert jobs.after_attempt(outcome, fault, attempts, 3, died, releases) is expected
    assert jobs.apply(State.RUNNING, expected)  # every answer is a row of the table
