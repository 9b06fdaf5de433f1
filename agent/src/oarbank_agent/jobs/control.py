"""The agent's side of the runner protocol's control document, decisions only (no processes,
no clock, no files): what a runner accepts, the document the agent keeps for an attempt, which
running jobs host protection pauses, resumes or releases, how a stopped attempt ended, and
which checkpoint an attempt leaves for the next one.

Rules
=====

- A runner accepts control when its manifest says so, by upstream's ``[runner].capabilities``
  words: ``cancellable`` (a stop is honoured at a safe point, acknowledged with
  ``failure.json`` ``fault = "transient"`` and exit 75), ``cooperative_pause`` (a pause holds it
  at its next safe point), ``checkpoint`` or ``resumable`` (it writes checkpoints; a stop also
  asks for one). Only such a runner gets ``<W>/control.json`` and nudges; any other is ended by
  its group, as before.
- The document is the agent's: kept in memory, written whole (``{seq, stop, pause,
  checkpoint?, reason?}``), ``seq`` 0 before the runner starts and one more on every change; a
  change that changes nothing is not written. The workdir copy is never read back.
- Pauses (``plan_pauses``): while host protection wants runners held, every running job that
  accepts a pause and is not stopping is paused; when it no longer does, every paused job is
  resumed. A pause lasts at most ``PAUSE_MAX_S``: then the job is released (not a failure).
- A stop the agent asked for (``stop_ending``): a success stands; anything else is a release
  (requeued, not charged), saying whether the runner acknowledged it, ended otherwise, or was
  ended by the agent at the grace.
- Checkpoints (``last_checkpoint``): the last ``checkpoint`` event of an attempt's
  ``events.ndjson`` whose files are all named safely (relative paths inside the workdir, no
  ``..``); its files are checked and copied by ``checkpoints.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

__all__ = ["PAUSE_MAX_S", "STOP", "PAUSE", "CHECKPOINT", "Accepts", "accepts", "Doc",
           "PauseView", "PausePlan", "plan_pauses", "stop_ending", "Checkpoint",
           "last_checkpoint", "ACKNOWLEDGED", "KILLED"]

STOP = "cancellable"
PAUSE = "cooperative_pause"
CHECKPOINT = ("checkpoint", "resumable")
PAUSE_MAX_S = 600.0  # upstream: a pause lasts at most 10 minutes, then the attempt is released

ACKNOWLEDGED = "acknowledged"  # exit 75 with failure.json fault "transient"
KILLED = "killed at the grace"


@dataclass(frozen=True)
class Accepts:
    stop: bool = False
    pause: bool = False
    checkpoint: bool = False

    @property
    def any(self) -> bool:
        return self.stop or self.pause or self.checkpoint


def accepts(raw_manifest: dict[str, Any]) -> Accepts:
    """What a runner declares in ``[runner].capabilities`` (the checker made it a list of
    strings when present)."""
    runner = raw_manifest.get("runner")
    caps = runner.get("capabilities") if isinstance(runner, dict) else None
    if not isinstance(caps, list):
        return Accepts()
    return Accepts(stop=STOP in caps, pause=PAUSE in caps,
                   checkpoint=any(c in caps for c in CHECKPOINT))


@dataclass(frozen=True)
class Doc:
    """The control document as the agent last wrote it."""

    seq: int = 0
    stop: bool = False
    pause: bool = False
    checkpoint: bool = False  # with a stop: write a checkpoint first
    reason: str | None = None

    def changed(self, **changes: Any) -> Doc:
        """The next document: ``self`` when nothing changes, else one ``seq`` newer."""
        new = replace(self, **changes)
        if replace(new, reason=self.reason) == self:
            return self
        return replace(new, seq=self.seq + 1)

    def text(self) -> str:
        out: dict[str, Any] = {"seq": self.seq, "stop": self.stop, "pause": self.pause}
        if self.checkpoint:
            out["checkpoint"] = True
        if self.reason is not None:
            out["reason"] = self.reason
        return json.dumps(out)


@dataclass(frozen=True)
class PauseView:
    """A running job as pausing sees it: whether it may be paused now (accepts a pause, its
    runner runs, no stop asked) and how long it has been paused (None: not paused)."""

    job_id: str
    pausable: bool
    paused_for_s: float | None


@dataclass(frozen=True)
class PausePlan:
    pause: tuple[str, ...] = ()
    resume: tuple[str, ...] = ()
    release: tuple[str, ...] = ()  # paused for PAUSE_MAX_S: released, not charged


def plan_pauses(hold: bool, jobs: Iterable[PauseView],
                max_pause_s: float = PAUSE_MAX_S) -> PausePlan:
    """What to do with the running jobs when host protection does (``hold``) or does not want
    runners held. In job id order."""
    jobs = sorted(jobs, key=lambda j: j.job_id)
    if not hold:
        return PausePlan(resume=tuple(j.job_id for j in jobs if j.paused_for_s is not None))
    return PausePlan(
        pause=tuple(j.job_id for j in jobs if j.pausable and j.paused_for_s is None),
        release=tuple(j.job_id for j in jobs
                      if j.paused_for_s is not None and j.paused_for_s >= max_pause_s))


def stop_ending(state: str, exit_code: int | None, fault: str | None,
                killed: bool) -> str | None:
    """How an attempt the agent asked to stop ended, for its history; None when it succeeded
    (a result written before the stop took effect stands)."""
    if state == "succeeded":
        return None
    if killed:
        return KILLED
    if state == "retry" and fault == "transient":
        return ACKNOWLEDGED
    return f"ended without acknowledging (exit {exit_code})"


@dataclass(frozen=True)
class Checkpoint:
    """One announced checkpoint: its files (path in the workdir -> name in the checkpoint
    folder) and its ``data``."""

    files: tuple[tuple[str, str], ...]
    data: dict[str, Any]


def _safe(rel: Any) -> bool:
    if not isinstance(rel, str) or not rel or "\\" in rel or "\0" in rel:
        return False
    p = PurePosixPath(rel)
    return not p.is_absolute() and ".." not in p.parts and "." not in rel.split("/")


def last_checkpoint(events_text: str) -> tuple[Checkpoint | None, str | None]:
    """The last well-formed ``checkpoint`` event of an events file, and why the last one
    announced was refused when it was (then the one before it is not used either: the runner
    meant the later one)."""
    for line in reversed(events_text.splitlines()):
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict) or ev.get("kind") != "checkpoint":
            continue
        files = ev.get("files")
        data = ev.get("data", {})
        if not isinstance(files, list) or not files:
            return None, "its checkpoint event lists no files"
        if not isinstance(data, dict):
            return None, "its checkpoint event's data is not an object"
        pairs = []
        for f in files:
            if not isinstance(f, dict) or not _safe(f.get("path")) or not _safe(f.get("name")):
                return None, f"its checkpoint event names a file unsafely: {str(f)[:200]}"
            pairs.append((f["path"], f["name"]))
        if len({n for _, n in pairs}) != len(pairs):
            return None, "its checkpoint event names a file twice"
        return Checkpoint(tuple(pairs), data), None
    return None, None
