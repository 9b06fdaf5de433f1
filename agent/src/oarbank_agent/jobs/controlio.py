"""One attempt's control document, effects only (``control.py`` decides): written into the
workdir, the runner nudged (the platform's ``Nudges``), the time it was held counted.

The document lives here, in memory; ``<W>/control.json`` is only ever written: whatever a job
puts there itself is replaced whole at the next change and never read (a link there is
replaced, not followed: the temporary file is made anew, exclusively, never through a link).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from oarbank_agent.jobs import control
from oarbank_agent.platform import fileflags
from oarbank_agent.platform.fateapi import Nudges, RunnerNudge

__all__ = ["AttemptControl", "FILE"]

FILE = "control.json"

log = logging.getLogger("oarbank_agent")


class AttemptControl:
    def __init__(self, workdir: Path, accepts: control.Accepts, nudges: Nudges,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = workdir / FILE
        self.accepts = accepts
        self.doc = control.Doc()
        self._nudges = nudges
        self.nudge: RunnerNudge | None = None  # this attempt's, from open() to ended()
        self._clock = clock
        self._leader: int | None = None
        self._alive: Callable[[], bool] = lambda: False
        self._paused_at: float | None = None
        self.paused_s = 0.0  # held in total this attempt (the agent's count)
        self.stop_asked_at: float | None = None
        self.killed = False  # ended by the agent at the grace, not by itself

    # --- the attempt's life ----------------------------------------------------------------

    def open(self) -> RunnerNudge:
        """Before the runner starts: ``{"seq": 0, ...}``, and how its runner is nudged (what
        its spawn passes it: ``env``, ``inherit``). Raises OSError."""
        self._write(self.doc)
        self.nudge = self._nudges.for_runner()
        return self.nudge

    def started(self, leader: int, alive: Callable[[], bool]) -> None:
        self._leader, self._alive = leader, alive

    def ended(self) -> None:
        """The runner is gone: a pause in force ends with it (its time counted)."""
        self._leader, self._alive = None, lambda: False
        self._count_pause()
        if self.nudge is not None:
            self.nudge.close()
            self.nudge = None

    @property
    def running(self) -> bool:
        return self._leader is not None and self._alive()

    def paused_for(self) -> float | None:
        return None if self._paused_at is None else self._clock() - self._paused_at

    # --- changes ---------------------------------------------------------------------------

    def pause(self, reason: str) -> bool:
        if not self._change(pause=True, reason=reason):
            return False
        self._paused_at = self._clock()
        return True

    def resume(self) -> bool:
        if not self._change(pause=False, reason=None):
            return False
        self._count_pause()
        return True

    def ask_stop(self, reason: str) -> bool:
        """A stop at the next safe point (a checkpoint first, for a runner that writes them);
        an ongoing pause ends with it."""
        changed = self._change(stop=True, pause=False, checkpoint=self.accepts.checkpoint,
                               reason=reason)
        if changed:
            self.stop_asked_at = self._clock()
            self._count_pause()
        return changed

    def _count_pause(self) -> None:
        if self._paused_at is not None:
            self.paused_s += self._clock() - self._paused_at
            self._paused_at = None

    def _change(self, **changes: object) -> bool:
        new = self.doc.changed(**changes)
        if new is self.doc or not self.running:
            return False
        try:
            self._write(new)
        except OSError as exc:
            log.warning("control: %s cannot be written (%s): the runner is not told", self.path,
                        exc)
            return False
        self.doc = new
        assert self._leader is not None and self.nudge is not None
        if not self.nudge.nudge(self._leader):
            log.info("control: the runner %d was gone before its nudge (seq %d)",
                     self._leader, new.seq)
        return True

    def _write(self, doc: control.Doc) -> None:
        """Temp file (made exclusively, not through a link) and rename: the runner reads the
        old document or the new one, never a part."""
        tmp = self.path.with_name(f".{FILE}.agent.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()  # (whatever the job left under that name: a link is removed, not followed)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | fileflags.NOFOLLOW
                     | fileflags.NOT_INHERITED, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(doc.text())
        os.replace(tmp, self.path)
