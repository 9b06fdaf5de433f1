"""The service's logs as the conformance kit shows them when a service check fails.

Where a service writes: each op's stderr (``<node>/ops/<service>/<op>.err``; the daemon that
``start`` leaves inherits ``start.err``, as on an agent it inherits the service log) and any
``*.log`` the service keeps in its data folder (``OARBANK_MODULE_DATA``). ``tail`` gives the
last lines of each, bounded (``logtail.read_tail``), newest files last; ``last_line`` the one
line an error quotes (``logtail.summary``, the same line the agent quotes).
"""

from __future__ import annotations

from pathlib import Path

from oarbank_sdk import logtail

__all__ = ["TAIL_LINES", "log_files", "tail", "last_line"]

TAIL_LINES = 20  # lines shown per file


def log_files(ops_dir: Path, data_dir: Path) -> list[Path]:
    """The service's non-empty log files: op stderr first (start's), then the data folder's."""
    found = sorted(ops_dir.glob("*.err"), key=lambda p: (p.name != "start.err", p.name))
    found += sorted(data_dir.glob("*.log"))
    return [p for p in found if p.is_file() and p.stat().st_size > 0]


def tail(ops_dir: Path, data_dir: Path, lines: int = TAIL_LINES) -> list[str]:
    """``== <file> ==`` then its last ``lines`` lines, for each log file."""
    out: list[str] = []
    for path in log_files(ops_dir, data_dir):
        text = logtail.read_tail(path).splitlines()[-lines:]
        out.append(f"== {path.name} ==")
        out.extend(line.rstrip() for line in text)
    return out


def last_line(ops_dir: Path, data_dir: Path) -> str | None:
    """The last meaningful line of the daemon's stderr (``start.err``), else of the data
    folder's logs; None when nothing was written."""
    for path in log_files(ops_dir, data_dir):
        line = logtail.summary(logtail.read_tail(path))
        if line:
            return line
    return None
