"""Why a child failed, in one short line: the end of its log, read with bounds (the agent's
errors and `oarbank-sdk conform` use it alike).

A failed op or runner usually says why on its last line of stderr (a Python traceback ends with
``FileNotFoundError: model weights missing``). The agent puts that line into the error it
records (``start exited with 1: FileNotFoundError: model weights missing``). The log itself may
be any size and hold anything: only its last ``TAIL_BYTES`` are ever read, and the summary is
at most ``SUMMARY_CHARS`` printable characters, so no child can flood the agent's memory or its
status rows. ``read_tail`` does the (bounded) reading, ``summary`` (pure) picks the line.
"""

from __future__ import annotations

import os
import re

__all__ = ["TAIL_BYTES", "SUMMARY_CHARS", "read_tail", "summary", "with_summary"]

TAIL_BYTES = 8192  # read at most this much of the end of a log
SUMMARY_CHARS = 300  # the summary never exceeds this

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_TRACEBACK = "Traceback (most recent call last):"


def read_tail(path: str | os.PathLike[str], start: int = 0, end: int | None = None,
              limit: int = TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``path`` between offsets ``start`` and ``end`` (end of
    file when None), decoded leniently; "" if it cannot be read."""
    try:
        with open(path, "rb") as f:
            stop = f.seek(0, os.SEEK_END) if end is None else end
            begin = max(start, stop - limit)
            if stop <= begin:
                return ""
            f.seek(begin)
            return f.read(stop - begin).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _clean(line: str) -> str:
    line = _ANSI.sub("", line).rsplit("\r", 1)[-1]  # a progress bar's last state
    return "".join(c if c.isprintable() else "?" for c in line).strip()


def summary(text: str, limit: int = SUMMARY_CHARS) -> str | None:
    """The last meaningful line(s) of ``text``, at most ``limit`` characters; None if there is
    nothing to say.

    Blank lines are skipped. After a Python traceback the exception lines are kept (the
    frames above them are not), joined with `` | `` when the message spans several lines.
    """
    lines = [c for c in (_clean(raw) for raw in text.splitlines()) if c]
    if not lines:
        return None
    picked = [lines[-1]]
    if _TRACEBACK in text:
        # The exception: the unindented lines after the last frame (frames are indented).
        raw = [r for r in text.splitlines() if r.strip()]
        tail: list[str] = []
        for r in reversed(raw):
            if r[:1].isspace() or r.startswith(_TRACEBACK):
                break
            tail.insert(0, _clean(r))
        picked = [t for t in tail if t] or picked
    out = " | ".join(picked)
    if len(out) > limit:
        out = out[: limit - 3].rstrip() + "..."
    return out


def with_summary(message: str, text: str) -> str:
    """``message: <summary of text>``, or ``message`` alone when the text says nothing."""
    s = summary(text)
    return f"{message}: {s}" if s else message
