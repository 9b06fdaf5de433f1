"""Did an attempt the previous agent left unfinished finish after all? The rule, pure.

A killed agent leaves attempts that began and have no outcome in their job's record. Their
runners are dead by the time the next agent looks (``platform/posix/tether.py`` kills them
when the agent dies; the next agent ends any that are left before it reads a job), so what the
attempt's workdir holds is final. The next agent *collects* such an attempt (records its
outcome, runs nothing again) only when the runner's own files prove it finished; every other
one is released and runs again (``recovery.uncharge_interrupted``).

What counts as proof (contract section 4), and nothing else a job writes:

- The runner's exit code cannot be known after a restart on any backend: its parent (the
  agent, or the agent's process factory) died with the status. So the files decide alone.
- ``result.json`` read whole (at most ``[results].max_inline_kb``) as a JSON object with the
  envelope ``{"envelope": 1, "payload": {...}}``: the runner writes it atomically (rename) as
  its last act before exit 0, so one that parses and validates is complete: **succeeded**.
  One over ``max_inline_kb`` fails as the job's fault, as it would have with exit 0 (it only
  grows while written). One that does not parse or validate proves nothing (a torn write of
  a runner that does not rename): run again.
- ``failure.json`` (no result) as ``{"reason": str, "detail"?: str, "fault": "job" | "host" |
  "transient"}``: the failure's class is what the exit code would have said; without a
  ``fault`` only that unseen exit could say it, so such a failure runs again. ``job`` and
  ``host`` fail the attempt, ``transient`` is a retry (charged, run again while attempts are
  left: the retry policy's, not the crash's doing).

``decide`` takes what was read (``Seen``); ``seen`` is the thin read around it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oarbank_sdk import advice

__all__ = ["Seen", "Verdict", "decide", "seen", "FAILURE_MAX_BYTES", "FAULTS"]

FAILURE_MAX_BYTES = 64 * 1024  # a failure.json is a reason and a detail: more is not read
FAULTS = {"job": "failed", "host": "failed", "transient": "retry"}  # fault -> outcome


@dataclass(frozen=True)
class Seen:
    """One file of the attempt's workdir as read: ``missing``, ``unreadable`` (I/O error or
    not JSON), ``too_big`` (``size`` bytes, not read) or ``parsed`` (``value``)."""

    state: str
    value: Any = None
    size: int = 0
    problem: str | None = None


@dataclass(frozen=True)
class Verdict:
    """``collect``: the attempt finished; its outcome as ``runner.classify`` would have said
    (``state`` succeeded | failed | retry, ``fault``, ``reason``, ``result``). Otherwise
    ``why`` it runs again."""

    collect: bool
    why: str
    state: str | None = None
    fault: str | None = None
    reason: str | None = None
    result: dict[str, Any] | None = None


def _failure_problem(doc: Any) -> str | None:
    """What keeps ``failure.json`` from saying a finished failure's class, or None."""
    if not isinstance(doc, dict):
        return "failure.json is not an object"
    if not isinstance(doc.get("reason"), str) or not doc["reason"]:
        return "failure.json has no 'reason' text"
    if doc.get("detail") is not None and not isinstance(doc["detail"], str):
        return "failure.json 'detail' is not text"
    if doc.get("fault") not in FAULTS:
        return ("failure.json names no 'fault' (job, host or transient): only the runner's "
                "exit code, not seen across the restart, could say what kind of failure")
    return None


def decide(result: Seen, failure: Seen, max_inline_kb: float) -> Verdict:
    """The verdict on an interrupted attempt from its ``result.json`` and ``failure.json``."""
    if result.state == "parsed":
        problem = advice.envelope_problem(result.value)
        if problem is None:
            return Verdict(True, "result.json is complete and valid", "succeeded",
                           result=result.value)
        return Verdict(False, f"result.json proves nothing: {problem}")
    if result.state == "too_big":
        return Verdict(True, "result.json is over the inline limit", "failed", "job",
                       advice.result_too_big(result.size, max_inline_kb))
    if failure.state == "parsed":
        problem = _failure_problem(failure.value)
        if problem is not None:
            return Verdict(False, problem)
        doc = failure.value
        reason = f"{doc['reason']}: {doc['detail']}" if doc.get("detail") else doc["reason"]
        return Verdict(True, "failure.json is complete and names its fault",
                       FAULTS[doc["fault"]], doc["fault"], reason)
    said = [f"{name} is {s.problem or s.state}" for name, s in
            (("result.json", result), ("failure.json", failure))]
    return Verdict(False, "; ".join(said))


def seen(path: Path, max_bytes: int) -> Seen:
    """``path`` read for ``decide``: never more than ``max_bytes``."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            return Seen("too_big", size=size)
        return Seen("parsed", json.loads(path.read_bytes()), size)
    except FileNotFoundError:
        return Seen("missing")
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        return Seen("unreadable", problem=f"unreadable ({exc})")
