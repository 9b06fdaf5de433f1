"""Reading files another process is still appending to.

A writer appends a record and its newline in more than one write when the record is long
(a buffered stream flushes in pieces), so a reader can find the first half of a line at the end
of the file. The last line counts only once its newline is there; an earlier line that does not
parse is a real fault and raises.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["complete_lines", "read_jsonl"]


def complete_lines(text: str) -> list[str]:
    """The lines of ``text`` that a writer has finished: all but an unterminated last one."""
    lines = text.split("\n")
    lines.pop()  # "" after a final newline, else the part still being written
    return lines


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The finished JSON records of ``path`` (none where it does not exist yet)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in complete_lines(text) if line.strip()]
