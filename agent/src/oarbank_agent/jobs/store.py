"""Job records: one JSON file per job, written atomically, so no submitted job is ever lost.

Layout: ``<state>/jobs/<job id>/job.json`` (the record) and ``<state>/jobs/<job id>/a<n>/``
(attempt n's workdir). A record is written (temp file, fsync, rename, fsync of the folder;
the first time also of ``jobs/``, which holds the new folder) before ``submit`` is answered,
and again at every state change, so a restarted agent finds every job in its last known
state (``load_all``) and can requeue what was not finished.

A record's ``state`` is the plain string of a ``jobs.State``; the states and their transitions
are ``machine.py``'s table.
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from oarbank_agent.jobs.machine import TERMINAL
from oarbank_agent.platform import fileflags

__all__ = ["JobRecord", "JobStore", "TERMINAL", "new_job_id"]

_seq = itertools.count()


def new_job_id() -> str:
    # Sortable by submission time, unique across agent restarts.
    return f"j{time.strftime('%Y%m%d%H%M%S')}-{next(_seq):04d}-{secrets.token_hex(3)}"


@dataclass
class JobRecord:
    job_id: str
    module: str
    stage: str
    payload: dict[str, Any]
    state: str = "queued"
    attempts: int = 0
    exit_code: int | None = None
    reason: str | None = None
    result: dict[str, Any] | None = None
    submitted_at: float = field(default_factory=time.time)
    seq: int = 0  # submission order, for FIFO across restarts
    started_at: float | None = None  # first runner start
    finished_at: float | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per attempt
    released: int = 0  # attempts ended by host protection: requeued, not charged
    # The latest attempt's id on service channels (an integer, contract section 3): services
    # log only this number, so status maps it back to the job.
    wire_attempt: int | None = None
    paused_s: float = 0.0  # seconds its runners were held by host protection (all attempts)
    # The last checkpoint an attempt left (checkpoints.py): the next attempt resumes from it.
    checkpoint: dict[str, Any] | None = None
    # A job granted by the portal (fleet dispatch, contract 10.4): {job_id (the portal's),
    # attempt_id, generation, report}; ``report`` is None until its result is acknowledged
    # ("accepted") or refused ("refused: <error>"). None: a local job (``submit``).
    portal: dict[str, Any] | None = None

    def public(self) -> dict[str, Any]:
        """The shape ``submit --wait`` prints."""
        return {"job_id": self.job_id, "module": self.module, "stage": self.stage,
                "state": self.state, "attempts": self.attempts, "exit_code": self.exit_code,
                "reason": self.reason, "result": self.result}

    def summary(self) -> dict[str, Any]:
        d = self.public()
        d.pop("result")
        d.update(released=self.released, wire_attempt=self.wire_attempt,
                 submitted_at=self.submitted_at, started_at=self.started_at,
                 finished_at=self.finished_at, paused_s=round(self.paused_s, 3),
                 # an attempt's outcome read after an agent restart (recovery.COLLECTED)
                 collected=any(bool(h.get("collected")) for h in self.history),
                 portal=self.portal)  # a portal job's grant (fleet dispatch), else None
        return d


# A record's fields, in order: what job.json holds.
_FIELDS = tuple(f.name for f in fields(JobRecord))


def _fsync_folder(path: str, o_directory: int) -> None:
    dfd = os.open(path, os.O_RDONLY | o_directory | fileflags.NOT_INHERITED)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _replace(path: str, data: bytes, *, durable: bool) -> None:
    """Write ``path`` whole: a temp file beside it (fsynced when ``durable``), renamed over
    it. Raises FileNotFoundError, having written nothing, when its folder does not exist."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | fileflags.NOT_INHERITED, 0o600)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


class JobStore:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "jobs"
        made = []  # the folders made now, innermost first
        p = self.dir
        while not p.exists() and p.parent != p:
            made.append(p)
            p = p.parent
        self.dir.mkdir(parents=True, exist_ok=True)
        if fileflags.DIRECTORY is not None:
            # Their names are durable before the first job's is (a record fsynced in a folder
            # a crash forgets is lost all the same): outermost first, each in its parent.
            for folder in reversed(made):
                _fsync_folder(str(folder.parent), fileflags.DIRECTORY)
        self._root = str(self.dir)
        self._seq = 0

    def job_dir(self, job_id: str) -> Path:
        return self.dir / job_id

    def save(self, rec: JobRecord) -> None:
        """Write the record atomically (temp file + rename).

        Only the states a restart acts on are fsynced: ``queued`` (a submitted job is never
        lost) and the terminal ones (a finished job is never run again). ``admitted`` and
        ``running`` are not worth two blocking fsyncs on the event loop per job: if a crash
        loses one, the record reads ``queued`` and a restarted agent requeues it, which is what
        it does for ``admitted``/``running`` anyway.
        """
        durable = rec.state == "queued" or rec.state in TERMINAL
        d = os.path.join(self._root, rec.job_id)
        path = os.path.join(d, "job.json")
        # Compact, and the fields as they are (json copies nothing; asdict's deep copy and an
        # indent, which takes json's pure-Python encoder, made a save ~1.6 ms on the loop).
        data = json.dumps({name: getattr(rec, name) for name in _FIELDS},
                          separators=(",", ":")).encode("utf-8")
        made_folder = False
        try:
            _replace(path, data, durable=durable)
        except FileNotFoundError:  # the job's first save: its folder is made then
            os.makedirs(d, exist_ok=True)
            made_folder = True
            _replace(path, data, durable=durable)
        o_directory = fileflags.DIRECTORY
        if not durable or o_directory is None:
            return  # (Windows: no folder to fsync; its rename is journalled by NTFS)
        _fsync_folder(d, o_directory)  # the rename itself survives a crash
        if made_folder:
            # ... and so does the job's folder: its entry is in jobs/, which only a journal
            # that commits everything at once (ext4's) would have made durable with the above.
            _fsync_folder(self._root, o_directory)

    def remove(self, job_id: str) -> None:
        """A final job's folder (record and attempt workdirs) is removed: kept long enough
        (``--keep-jobs-s``). Its wire attempt numbers stay used (``wire_floor``)."""
        shutil.rmtree(self.job_dir(job_id), ignore_errors=True)

    def keep_wire_floor(self, n: int) -> None:
        """Attempt numbers on the channel up to ``n`` were used by records removed since: a
        restarted agent continues after them, not after what is left. As durable as a
        record (fsynced, its rename too) before it returns, so before those records go: a
        crash can never leave the numbers neither recorded nor floored (handed out twice)."""
        if n > self.wire_floor():
            _replace(os.path.join(self._root, "wire_floor"), f"{n}\n".encode(), durable=True)
            if fileflags.DIRECTORY is not None:
                _fsync_folder(self._root, fileflags.DIRECTORY)

    def wire_floor(self) -> int:
        try:
            return int((self.dir / "wire_floor").read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            return 0

    def create(self, module: str, stage: str, payload: dict[str, Any],
               portal: dict[str, Any] | None = None) -> JobRecord:
        self._seq += 1
        rec = JobRecord(new_job_id(), module, stage, payload, seq=self._seq, portal=portal)
        self.save(rec)
        return rec

    def load_all(self) -> list[JobRecord]:
        """Every readable record, in submission order. Unreadable ones are skipped (and kept
        on disk for a person to look at)."""
        out = []
        for p in self.dir.glob("*/job.json"):
            try:
                d = json.loads(p.read_text(encoding="utf-8"))
                out.append(JobRecord(**d))
            except (OSError, ValueError, TypeError):
                continue
        out.sort(key=lambda r: (r.submitted_at, r.seq))
        self._seq = max([self._seq, *(r.seq for r in out)])
        return out
