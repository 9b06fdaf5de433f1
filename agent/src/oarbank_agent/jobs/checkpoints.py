"""Checkpoints between attempts, effects only (``control.last_checkpoint`` picks the event).

``take``: once an attempt is over (its whole group ended), its last announced checkpoint is
checked: each file a regular file inside the workdir (not through a link), all of them at
most ``max_bytes``; the job record keeps which attempt, the files, the runner's ``data`` and a
digest over the files' names and contents (``sha256:<hex>``). ``restore``: the next attempt
gets those files under ``<W>/checkpoint/<name>``, copied from the attempt that wrote them and
checked against the digest (a copy that differs is not used: the attempt starts afresh);
its spec then carries ``resume = {from_attempt, digest, data}``, its history entry
``resumed_from_attempt`` and ``resume_digest`` (upstream's names).

The runner wrote every byte read here: nothing is followed through a link, nothing outside
its workdir is read, and the checkpoint folder is written by the agent only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from oarbank_agent.jobs import control, runnerevents
from oarbank_agent.platform import fileflags

__all__ = ["DEFAULT_MAX_MB", "RESUME_DIR", "take", "restore", "max_bytes"]

DEFAULT_MAX_MB = 256.0  # a stage's checkpoint.max_mb, when it names none
RESUME_DIR = "checkpoint"  # <W>/checkpoint/ (oarbank_sdk.control.CHECKPOINT_DIR)
_CHUNK = 1 << 20


def max_bytes(raw_stage: dict[str, Any] | None) -> int:
    """The stage's ``checkpoint.max_mb`` (upstream's key), else ``DEFAULT_MAX_MB``."""
    ck = raw_stage.get("checkpoint") if isinstance(raw_stage, dict) else None
    mb = ck.get("max_mb") if isinstance(ck, dict) else None
    if not isinstance(mb, (int, float)) or isinstance(mb, bool) or mb <= 0:
        mb = DEFAULT_MAX_MB
    return int(mb * 2**20)


def _open_inside(root: Path, rel: str) -> int:
    """``root/rel`` opened for reading: inside ``root`` once resolved, never through a link at
    its last part, a regular file. Raises OSError / ValueError naming what is wrong."""
    where = (root / rel).resolve()
    if not where.is_relative_to(root.resolve()):
        raise ValueError(f"{rel} leads outside the workdir")
    fd = os.open(root / rel, os.O_RDONLY | fileflags.NOFOLLOW | fileflags.NONBLOCK
                 | fileflags.NOT_INHERITED)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{rel} is not a regular file")
    return fd


def _digest(pairs: list[tuple[str, str]]) -> str:
    """Over each file's name and content digest, in name order."""
    h = hashlib.sha256()
    for name, hexd in sorted(pairs):
        h.update(f"{name}\0{hexd}\n".encode())
    return "sha256:" + h.hexdigest()


def _copy(fd: int, dest: Path | None, budget: int) -> tuple[str, int]:
    """Read ``fd`` to its end (into ``dest`` when given): its sha256 and size; ValueError past
    ``budget`` bytes."""
    h = hashlib.sha256()
    size = 0
    out = open(dest, "xb") if dest is not None else None  # noqa: SIM115 - closed below
    try:
        while chunk := os.read(fd, _CHUNK):
            size += len(chunk)
            if size > budget:
                raise ValueError("its checkpoint is larger than the stage's checkpoint.max_mb")
            h.update(chunk)
            if out is not None:
                out.write(chunk)
    finally:
        os.close(fd)
        if out is not None:
            out.close()
    return h.hexdigest(), size


def take(workdir: Path, attempt: int, budget: int) -> tuple[dict[str, Any] | None, str | None]:
    """The attempt's last checkpoint as the record keeps it, or None; and why its last
    announced checkpoint is not kept, when it is not."""
    try:
        fd = os.open(workdir / runnerevents.FILE, os.O_RDONLY | fileflags.NOFOLLOW
                     | fileflags.NONBLOCK | fileflags.NOT_INHERITED)
    except OSError:
        return None, None  # no events: no checkpoint
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None, f"{runnerevents.FILE} is not a regular file"
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - runnerevents.FILE_MAX))
        text = f.read(runnerevents.FILE_MAX).decode("utf-8", errors="replace")
    found, problem = control.last_checkpoint(text)
    if found is None:
        return None, problem
    pairs, left = [], budget
    try:
        for path, name in found.files:
            hexd, n = _copy(_open_inside(workdir, path), None, left)
            left -= n
            pairs.append((name, hexd))
    except (OSError, ValueError) as exc:
        return None, f"its checkpoint is not kept: {exc}"
    return {"attempt": attempt, "files": [list(p) for p in found.files], "data": found.data,
            "digest": _digest(pairs), "bytes": budget - left}, None


def restore(job_dir: Path, kept: dict[str, Any], workdir: Path) -> str | None:
    """Copy the kept checkpoint into ``workdir/checkpoint/``; None when done, else why not
    (nothing of it is left in the workdir then)."""
    source = job_dir / f"a{kept['attempt']}"
    dest = workdir / RESUME_DIR
    pairs = []
    try:
        dest.mkdir(parents=True)
        for path, name in kept["files"]:
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            hexd, _ = _copy(_open_inside(source, path), target, int(kept["bytes"]))
            pairs.append((name, hexd))
        if _digest(pairs) != kept["digest"]:
            raise ValueError(f"attempt {kept['attempt']}'s checkpoint files changed since it "
                             "ended (digest differs)")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        return str(exc)
    return None
