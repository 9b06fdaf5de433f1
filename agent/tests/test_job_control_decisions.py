"""The control plane's decisions (jobs/control.py), row by row: what a runner accepts, the
document's sequence, pauses, how a stopped attempt ended, which checkpoint is kept."""

from __future__ import annotations

import json

import pytest

from oarbank_agent.jobs import control
from oarbank_agent.jobs.control import Accepts, Doc, PausePlan, PauseView


@pytest.mark.parametrize(("runner", "want"), [
    ({"capabilities": ["cancellable", "cooperative_pause", "checkpoint"]},
     Accepts(stop=True, pause=True, checkpoint=True)),
    ({"capabilities": ["cancellable"]}, Accepts(stop=True)),
    ({"capabilities": ["cooperative_pause"]}, Accepts(pause=True)),
    ({"capabilities": ["resumable"]}, Accepts(checkpoint=True)),
    ({"capabilities": ["events", "deterministic_output", "freeze_ok"]}, Accepts()),
    ({}, Accepts()),
    (None, Accepts()),  # no [runner]
])
def test_what_a_runner_accepts(runner: dict | None, want: Accepts) -> None:
    raw = {"runner": runner} if runner is not None else {}
    assert control.accepts(raw) == want
    assert control.accepts(raw).any == (want != Accepts())


@pytest.mark.parametrize(("changes", "seq", "text"), [
    ({}, 0, {"seq": 0, "stop": False, "pause": False}),  # nothing changes: not newer
    ({"pause": False}, 0, {"seq": 0, "stop": False, "pause": False}),
    ({"reason": "why"}, 0, {"seq": 0, "stop": False, "pause": False}),  # a reason alone is none
    ({"pause": True, "reason": "memory"}, 1,
     {"seq": 1, "stop": False, "pause": True, "reason": "memory"}),
    ({"stop": True, "checkpoint": True, "reason": "drain"}, 1,
     {"seq": 1, "stop": True, "pause": False, "checkpoint": True, "reason": "drain"}),
])
def test_the_document_is_newer_only_when_it_changes(changes: dict, seq: int, text: dict) -> None:
    new = Doc().changed(**changes)
    assert new.seq == seq
    assert json.loads(new.text()) == text


def test_seq_counts_the_agents_own_changes() -> None:
    d = Doc().changed(pause=True).changed(pause=True).changed(pause=False).changed(stop=True)
    assert d.seq == 3 and d.stop and not d.pause


@pytest.mark.parametrize(("hold", "jobs", "plan"), [
    (True, [PauseView("b", True, None), PauseView("a", True, None)], PausePlan(pause=("a", "b"))),
    (True, [PauseView("a", False, None)], PausePlan()),  # does not accept it, or stopping
    (True, [PauseView("a", True, 5.0)], PausePlan()),  # already paused
    (True, [PauseView("a", True, 600.0), PauseView("b", True, 599.0)],
     PausePlan(release=("a",))),  # paused 10 minutes: released
    (False, [PauseView("a", True, 3.0), PauseView("b", True, None)], PausePlan(resume=("a",))),
    (False, [PauseView("a", True, 700.0)], PausePlan(resume=("a",))),  # pressure over first
    (False, [], PausePlan()),
])
def test_pauses(hold: bool, jobs: list[PauseView], plan: PausePlan) -> None:
    assert control.plan_pauses(hold, jobs) == plan


@pytest.mark.parametrize(("state", "code", "fault", "killed", "want"), [
    ("succeeded", 0, None, False, None),  # its result stands
    ("retry", 75, "transient", False, "acknowledged"),
    ("failed", 1, None, False, "ended without acknowledging (exit 1)"),
    ("failed", 75, None, False, "ended without acknowledging (exit 75)"),  # no failure.json
    ("failed", 2, "job", False, "ended without acknowledging (exit 2)"),
    ("failed", None, None, True, "killed at the grace"),
])
def test_how_a_stopped_attempt_ended(state: str, code: int | None, fault: str | None,
                                     killed: bool, want: str | None) -> None:
    assert control.stop_ending(state, code, fault, killed) == want


def _ev(files: object, data: object = None, kind: str = "checkpoint") -> str:
    ev: dict = {"t": 1.0, "kind": kind, "files": files}
    if data is not None:
        ev["data"] = data
    return json.dumps(ev)


GOOD = [{"path": "ckpt/000002/state.json", "name": "state.json"}]


@pytest.mark.parametrize(("lines", "files", "problem"), [
    ([], None, None),
    ([_ev(GOOD, {"next": 4}), '{"kind": "progress"}', "not json"],
     (("ckpt/000002/state.json", "state.json"),), None),  # the last checkpoint, not the last line
    ([_ev([{"path": "a", "name": "a"}]), _ev(GOOD)], (("ckpt/000002/state.json", "state.json"),),
     None),
    ([_ev([{"path": "../other/a", "name": "a"}])], None, "unsafely"),
    ([_ev([{"path": "/etc/passwd", "name": "a"}])], None, "unsafely"),
    ([_ev([{"path": "ckpt/a", "name": "../../a"}])], None, "unsafely"),
    ([_ev([{"path": "ckpt/a", "name": "a"}, {"path": "ckpt/b", "name": "a"}])], None, "twice"),
    ([_ev([])], None, "no files"),
    ([_ev(GOOD, ["not", "an object"])], None, "data"),
    # a refused last checkpoint is not replaced by an earlier one: the runner meant the later
    ([_ev(GOOD), _ev([{"path": "..", "name": "x"}])], None, "unsafely"),
])
def test_which_checkpoint_is_kept(lines: list[str], files: tuple | None,
                                  problem: str | None) -> None:
    found, why = control.last_checkpoint("\n".join(lines))
    assert (found.files if found else None) == files
    assert (problem is None and why is None) or (problem is not None and problem in (why or ""))
