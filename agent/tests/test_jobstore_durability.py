"""What a crash may not lose of a job record (store.py): the record is on disk, fsynced, with
its rename and, for a new job, its folder's entry in ``jobs/``, before ``submit`` hears of it;
``jobs/`` and the state folder, where the store made them, are named durably in their parents.

A power cut cannot be made here; the test watches the real calls instead (each wrapped,
still made, and recorded by the inode it touched) and checks their order: a file's fsync
makes its data durable, a folder's fsync the names in it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oarbank_agent.jobs.store import JobStore
from oarbank_agent.platform import fileflags

pytestmark = pytest.mark.skipif(fileflags.DIRECTORY is None,
                                reason="no folder to fsync on Windows (NTFS journals renames)")


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    seen: list[tuple[str, int]] = []
    real_fsync, real_makedirs = os.fsync, os.makedirs

    def fsync(fd: int) -> None:
        real_fsync(fd)
        seen.append(("fsync", os.fstat(fd).st_ino))

    def makedirs(path: Any, *args: Any, **kwargs: Any) -> None:
        real_makedirs(path, *args, **kwargs)
        seen.append(("mkdir", os.stat(path).st_ino))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "makedirs", makedirs)
    return seen


def _ino(path: Path) -> int:
    return path.stat().st_ino


def test_a_new_job_is_durable_with_its_folder_before_create_returns(
        tmp_path: Path, calls: list[tuple[str, int]]) -> None:
    store = JobStore(tmp_path)
    calls.clear()  # jobs/ made (the last test)
    rec = store.create("dev.example.m", "s", {"x": 1})
    folder = store.job_dir(rec.job_id)
    assert calls == [("mkdir", _ino(folder)),
                     ("fsync", _ino(folder / "job.json")),  # the record's bytes
                     ("fsync", _ino(folder)),               # its name (the rename)
                     ("fsync", _ino(store.dir))]            # the job's folder in jobs/
    assert [r.job_id for r in JobStore(tmp_path).load_all()] == [rec.job_id]


def test_later_saves_fsync_what_a_restart_acts_on_and_nothing_more(
        tmp_path: Path, calls: list[tuple[str, int]]) -> None:
    store = JobStore(tmp_path)
    rec = store.create("dev.example.m", "s", {})
    folder = store.job_dir(rec.job_id)
    calls.clear()
    rec.state = "running"  # a restart requeues it either way: not worth an fsync
    store.save(rec)
    assert calls == []
    rec.state = "succeeded"  # never run again: durable, its folder is known already
    store.save(rec)
    assert calls == [("fsync", _ino(folder / "job.json")), ("fsync", _ino(folder))]
    [again] = JobStore(tmp_path).load_all()
    assert again.state == "succeeded"


def test_the_folders_a_first_start_makes_are_durable_in_their_parents(
        tmp_path: Path, calls: list[tuple[str, int]]) -> None:
    state = tmp_path / "state"
    store = JobStore(state)
    assert calls == [("fsync", _ino(tmp_path)), ("fsync", _ino(state))]
    assert store.dir.is_dir()
    calls.clear()
    JobStore(state)  # a restart: nothing new to make durable
    assert calls == []


def test_the_wire_floor_is_as_durable_as_a_record(
        tmp_path: Path, calls: list[tuple[str, int]]) -> None:
    """The floor stands for removed records' attempt numbers: its bytes and its rename are
    fsynced before keep_wire_floor returns (the queue removes the records after it)."""
    store = JobStore(tmp_path)
    calls.clear()
    store.keep_wire_floor(7)
    assert calls == [("fsync", _ino(store.dir / "wire_floor")),  # its bytes
                     ("fsync", _ino(store.dir))]                 # its name (the rename)
    calls.clear()
    store.keep_wire_floor(3)  # a floor never goes down, and nothing is written for it
    assert calls == [] and JobStore(tmp_path).wire_floor() == 7


_CRASHING = """
import os, signal, sys
from pathlib import Path
from oarbank_agent.jobs.store import JobStore
real = os.replace
def replace(src, dst):
    if sys.argv[2] == "after":
        real(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)  # the agent dies here (a crash, not an exception)
os.replace = replace
JobStore(Path(sys.argv[1])).keep_wire_floor(9)
"""


@pytest.mark.parametrize(("when", "floor"), [("before", 5), ("after", 9)])
def test_a_crash_while_the_floor_is_written_leaves_a_floor_a_restart_reads(
        tmp_path: Path, when: str, floor: int) -> None:
    """A real process killed (SIGKILL) just before, or just after, the floor's rename: the
    next store reads the old floor or the new one, never nothing, and writes again over the
    temp file the crash left."""
    JobStore(tmp_path).keep_wire_floor(5)
    r = subprocess.run([sys.executable, "-c", _CRASHING, str(tmp_path), when], timeout=60)
    assert r.returncode == -9
    store = JobStore(tmp_path)
    assert store.wire_floor() == floor
    store.keep_wire_floor(11)
    assert JobStore(tmp_path).wire_floor() == 11
    assert sorted(p.name for p in store.dir.iterdir()) == ["wire_floor"]
