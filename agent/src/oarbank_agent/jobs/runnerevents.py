"""Runner events (G12): ``--events <W>/events.ndjson`` for runners that emit events (contract
section 4), kept with the attempt.

A runner says it emits events in its manifest: ``[runner].capabilities`` lists ``"events"``
(the contract's ``[runner]`` keys; the checker reads ``capabilities`` as a list of strings), or
upstream's ``"progress_events"`` or ``"checkpoint"`` (a checkpoint is announced as an event:
upstream's ``Checkpoints.write`` fails without the file). Only such a runner gets the flag: one
that does not know it would refuse its argv.

The file is the runner's, in its workdir, one JSON object per line. Once the attempt is over
(its whole group ended) the agent keeps it bounded, like its other state: a file over
``FILE_MAX`` bytes is cut to its last ``FILE_MAX`` bytes (whole lines), and the attempt's
history entry gets its last ``KEEP`` events (``events``), how many lines were read and how many
bytes were cut (``collect``). ``status``/``job`` show the latest attempt's events.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from oarbank_agent.platform import fileflags
from oarbank_sdk import manifest as mf

__all__ = ["CAPABILITY", "FILE", "FILE_MAX", "KEEP", "argv", "collect", "declared", "parse"]

CAPABILITY = "events"
UPSTREAM_CAPABILITIES = ("progress_events", "checkpoint")  # upstream's names that get it too
FILE = "events.ndjson"
FILE_MAX = 1 << 20  # bytes of an attempt's events file kept on disk
KEEP = 20  # events kept in the attempt's history entry (the last ones)


def declared(manifest: mf.Manifest) -> bool:
    runner = manifest.raw.get("runner")
    caps = runner.get("capabilities") if isinstance(runner, dict) else None
    return isinstance(caps, list) and any(c in caps for c in (CAPABILITY, *UPSTREAM_CAPABILITIES))


def argv(workdir: Path) -> list[str]:
    return ["--events", str(workdir / FILE)]


def parse(text: str, keep: int = KEEP) -> tuple[list[dict[str, Any]], int]:
    """(the last ``keep`` events, how many lines were JSON objects). Other lines are skipped:
    the file is the runner's to write, the agent only reports it."""
    events = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            events.append(obj)
    return events[-keep:], len(events)


def collect(workdir: Path) -> dict[str, Any]:
    """The attempt's events for its history entry; the file is cut to ``FILE_MAX`` first.
    Nothing (``{}``) when the runner wrote none. The runner wrote the file: it is opened
    without following a link and read only if it is a regular file."""
    path = workdir / FILE
    try:
        fd = os.open(path, os.O_RDONLY | fileflags.NOFOLLOW | fileflags.NONBLOCK)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return {"events": [], "events_count": 0,
                    "events_problem": f"{FILE} is not a regular file"}
        size = st.st_size
        f.seek(max(0, size - FILE_MAX))
        data = f.read(FILE_MAX)
    cut = 0
    if size > FILE_MAX:
        data = data[data.find(b"\n") + 1:]  # from a whole line on
        cut = size - len(data)
        tmp = path.with_name(FILE + ".tmp")
        tmp.unlink(missing_ok=True)  # (whatever the runner left under that name)
        out_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | fileflags.NOFOLLOW, 0o600)
        with os.fdopen(out_fd, "wb") as out_f:
            out_f.write(data)
        os.replace(tmp, path)
    events, count = parse(data.decode("utf-8", errors="replace"))
    out: dict[str, Any] = {"events": events, "events_count": count}
    if cut:
        out["events_cut_bytes"] = cut  # the file's start, over FILE_MAX
    return out
