"""A runner's side of the control document (runner protocol, "Control") and of portable
checkpoints, by upstream's names. Standard library only: a runner may copy this file.

The agent keeps ``<W>/control.json`` (``{seq, stop, pause, checkpoint?, threads?, gpu_duty?}``)
and, after each change, nudges the runner: SIGUSR1 on POSIX, the auto-reset event whose handle
is in ``OARBANK_CONTROL_EVENT`` on Windows. ``Control`` reads the document once when made and
again only after a nudge; a document whose ``seq`` is not newer than the last one applied is
ignored, and so is one that is not a JSON object with an integer ``seq``.

    ctl = Control()                    # POSIX: on the main thread (it installs the handler)
    ctl.phase("work")
    try:
        for chunk in work:
            ctl.safe_point()           # Stopped on a stop; blocks while paused
            do(chunk, threads=ctl.threads or 4)
    except Stopped:
        sys.exit(ctl.acknowledge_stop())   # failure.json, fault "transient"; 75

``Checkpoints`` writes a checkpoint into a fresh directory and announces it with a
``checkpoint`` event on the ``--events`` file; a resumed attempt finds the last one under
``<W>/checkpoint/`` and the spec's ``resume`` object.

This project's agent writes the document for a runner that declares ``cancellable``,
``cooperative_pause`` or ``checkpoint``, on every platform it runs on; with no
document, ``Control`` never stops nor pauses and ``safe_point`` costs one non-blocking read.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINT_DATA_MAX", "CHECKPOINT_DIR", "ENV_CONTROL_EVENT", "EXIT_STOPPED",
           "REPLACE_RETRY_S", "Checkpoints", "Control", "Stopped", "replace_text"]

ENV_CONTROL_EVENT = "OARBANK_CONTROL_EVENT"  # Windows: the inherited event's handle, in decimal
EXIT_STOPPED = 75  # EX_TEMPFAIL: a stop the agent asked for is transient, never the job's fault
REPLACE_RETRY_S = 2.0  # Windows refuses a rename over a file the other side holds open
CHECKPOINT_DIR = "checkpoint"  # <W>/checkpoint/: what a resumed attempt starts from
CHECKPOINT_DATA_MAX = 4096  # bytes of a checkpoint event's ``data`` as compact JSON


def replace_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8 through a temporary file and a rename, so a reader
    sees the old content or the new, never a part; a rename refused because the reader has the
    file open (Windows) is tried again for up to ``REPLACE_RETRY_S``."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    give_up = time.monotonic() + REPLACE_RETRY_S
    while True:
        try:
            os.replace(tmp, target)
            return
        except PermissionError:
            if time.monotonic() >= give_up:
                raise
            time.sleep(0.01)


class Stopped(Exception):
    """The agent asked this job to stop: leave at once, through ``acknowledge_stop``."""


if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
    import _winapi

    class _Nudges:
        """The auto-reset event the agent sets after each change; waiting on it resets it."""

        def __init__(self) -> None:
            raw = os.environ.get(ENV_CONTROL_EVENT, "")
            self._handle = int(raw) if raw.isdigit() else None

        def take(self) -> bool:
            if self._handle is None:
                return False
            return _winapi.WaitForSingleObject(self._handle, 0) == _winapi.WAIT_OBJECT_0

        def wait(self) -> None:
            if self._handle is None:
                raise RuntimeError(f"paused with no way to be resumed: {ENV_CONTROL_EVENT} is "
                                   "not set (the runner was not started by an agent)")
            _winapi.WaitForSingleObject(self._handle, _winapi.INFINITE)

else:
    import atexit
    import select
    import signal

    # One self-pipe per process: SIGUSR1 leaves a byte in it, whichever thread the signal hits.
    _pipe: tuple[int, int] | None = None

    def _on_nudge(_signum: int, _frame: Any) -> None:
        assert _pipe is not None
        try:
            os.write(_pipe[1], b"!")
        except BlockingIOError:  # full: a nudge is already pending, which is all it says
            pass

    def _install() -> tuple[int, int]:
        global _pipe
        if _pipe is not None:
            return _pipe
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            signal.signal(signal.SIGUSR1, _on_nudge)
        except ValueError:  # not the main thread
            os.close(r)
            os.close(w)
            raise RuntimeError("make Control on the main thread: it installs the SIGUSR1 "
                               "handler the agent's nudges arrive through") from None
        # The wakeup fd is written by the interpreter's C handler at once, so a select() in
        # any thread wakes even while the main thread is busy; keep someone else's if set.
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if previous != -1:
            signal.set_wakeup_fd(previous)
        # During interpreter teardown the default action (terminate) would come back: a nudge
        # arriving then would kill a runner that has already finished. Ignore them instead.
        atexit.register(signal.signal, signal.SIGUSR1, signal.SIG_IGN)
        _pipe = (r, w)
        return _pipe

    class _Nudges:
        def __init__(self) -> None:
            self._read_fd = _install()[0]

        def take(self) -> bool:
            """Whether a nudge came since the last look (never blocks)."""
            seen = False
            while True:
                try:
                    chunk = os.read(self._read_fd, 256)
                except BlockingIOError:
                    return seen
                if not chunk:
                    return seen
                seen = True

        def wait(self) -> None:
            while not self.take():
                select.select([self._read_fd], [], [])


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _fraction_or_none(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1:
        return float(value)
    return None


class Control:
    """The control document as this runner last applied it (``seq``, ``stop``, ``pause``,
    ``checkpoint``, ``threads``, ``gpu_duty``) and the time it has spent held (``paused_s``).

    ``workdir`` defaults to ``OARBANK_WORKDIR`` (else the current directory)."""

    def __init__(self, workdir: str | os.PathLike[str] | None = None) -> None:
        base = workdir if workdir is not None else os.environ.get("OARBANK_WORKDIR", ".")
        self.path = Path(base) / "control.json"
        self.seq = -1
        self.stop = False
        self.pause = False
        self.checkpoint = False
        self.threads: int | None = None
        self.gpu_duty: float | None = None
        self.paused_s = 0.0
        # Handler first, then drain, then read: a change made after the read leaves a nudge.
        self._nudges = _Nudges()
        self._nudges.take()
        self.refresh()

    def refresh(self) -> bool:
        """Read the document; apply it when its ``seq`` is newer. Whether anything applied."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False  # none yet, or caught between writes (the agent renames: rare)
        if not isinstance(doc, dict):
            return False
        seq = doc.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq <= self.seq:
            return False
        self.seq = seq
        self.stop = doc.get("stop") is True
        self.pause = doc.get("pause") is True
        self.checkpoint = doc.get("checkpoint") is True
        self.threads = _int_or_none(doc.get("threads"))
        self.gpu_duty = _fraction_or_none(doc.get("gpu_duty"))
        return True

    @property
    def checkpoint_requested(self) -> bool:
        """A stop that asks for a checkpoint first: write one, then acknowledge the stop."""
        return self.stop and self.checkpoint

    def check(self) -> None:
        """Apply a change the agent nudged about, without blocking; ``Stopped`` on a stop."""
        if self._nudges.take():
            self.refresh()
        if self.stop:
            raise Stopped()

    def safe_point(self) -> None:
        """``check``, then hold while paused until a nudge brings a change; the time held is
        added to ``paused_s``."""
        self.check()
        while self.pause:
            held_from = time.perf_counter()
            self._nudges.wait()
            self.paused_s += time.perf_counter() - held_from
            self.refresh()
            if self.stop:
                raise Stopped()

    def phase(self, name: str) -> None:
        """``<W>/phase``: one line naming what the job is doing now."""
        replace_text(self.path.with_name("phase"), name + "\n")

    def acknowledge_stop(self, reason: str | None = None) -> int:
        """Write ``<W>/failure.json`` saying the job stopped on request (``fault`` transient;
        ``reason`` defaults to ``<OARBANK_MODULE>/stopped``) and return the exit code, 75."""
        module = os.environ.get("OARBANK_MODULE") or "module"
        failure = {"reason": reason or f"{module}/stopped", "fault": "transient",
                   "detail": "stopped at a safe point because the agent asked"}
        replace_text(self.path.with_name("failure.json"), json.dumps(failure))
        return EXIT_STOPPED


class Checkpoints:
    """Portable checkpoints of one attempt: ``write`` makes them, ``resume``/``resume_dir``/
    ``resume_data`` read the one this attempt resumes from.

    ``events``: the ``--events`` path the agent passed (needed to write); ``spec``: the parsed
    ``spec.json`` (its ``resume`` object says this attempt resumes)."""

    def __init__(self, workdir: str | os.PathLike[str] | None = None,
                 events: str | os.PathLike[str] | None = None,
                 spec: dict[str, Any] | None = None) -> None:
        self.workdir = Path(workdir if workdir is not None
                            else os.environ.get("OARBANK_WORKDIR", "."))
        self.events = Path(events) if events else None
        self.spec = spec or {}
        self.seq = 0

    def resume(self) -> dict[str, Any] | None:
        """The spec's ``resume`` (``{from_attempt, digest, data}``) when this attempt resumes
        and its files are under ``<W>/checkpoint/``; None otherwise."""
        found = self.spec.get("resume")
        if isinstance(found, dict) and self.resume_dir().is_dir():
            return found
        return None

    def resume_dir(self) -> Path:
        """``<W>/checkpoint/``: the checkpoint's files under their names (read them only)."""
        return self.workdir / CHECKPOINT_DIR

    def resume_data(self) -> dict[str, Any]:
        """The resumed checkpoint's ``data`` ({} when not resuming)."""
        found = self.resume()
        data = found.get("data") if found else None
        return dict(data) if isinstance(data, dict) else {}

    @contextlib.contextmanager
    def write(self, data: dict[str, Any] | None = None) -> Iterator[Path]:
        """A new, empty directory to write one checkpoint's files into. When the block ends
        without an error, every regular file in it is announced as the checkpoint (by its
        path inside the directory), with ``data``; the files are then the agent's."""
        payload = data or {}
        size = len(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8"))
        if size > CHECKPOINT_DATA_MAX:
            raise ValueError(f"checkpoint data is {size} bytes as JSON; the most is "
                             f"{CHECKPOINT_DATA_MAX}")
        if self.events is None:
            raise RuntimeError("no --events file to announce the checkpoint on: the agent "
                               "passes one to a runner that declares `checkpoint`")
        self.seq += 1
        where = self.workdir / "ckpt" / f"{self.seq:06d}"
        where.mkdir(parents=True)
        yield where
        files = [{"path": f.relative_to(self.workdir).as_posix(),
                  "name": f.relative_to(where).as_posix()}
                 for f in sorted(where.rglob("*")) if f.is_file() and not f.is_symlink()]
        if not files:
            raise ValueError(f"checkpoint {where} holds no file: a checkpoint needs one")
        event = {"t": time.time(), "kind": "checkpoint", "files": files, "data": payload}
        with open(self.events, "a", encoding="utf-8", newline="\n") as out:
            out.write(json.dumps(event, separators=(",", ":")) + "\n")
            out.flush()
            os.fsync(out.fileno())
