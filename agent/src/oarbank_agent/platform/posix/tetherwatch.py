"""Fate sharing on POSIX, the watcher: ``python -I -m oarbank_agent.platform.posix.tetherwatch
<state dir> <fd>``, started by the agent (``tether.py``, which says why a pipe). It waits for
EOF on the pipe ``fd`` (the agent ended, however), then kills every live runner group recorded
in ``<state dir>/procs`` and exits. Not imported by the agent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from oarbank_agent import platform

if TYPE_CHECKING:
    from oarbank_agent.platform.api import Groups

__all__ = ["end_runners", "main"]


def end_runners(procs_dir: Path, groups: Groups,
                say: Callable[[str], None] | None = None) -> list[str]:
    """Kill every live runner group recorded in ``procs_dir``; their labels (attempt ids).
    Records are left for the next agent (it forgets those whose group is gone)."""
    ended = []
    for path in sorted(procs_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
            if doc.get("kind") != "runner":
                continue
            group = groups.restore(doc)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # torn or gone: the next agent reads it again
        if group.alive():
            group.kill()
            ended.append(str(doc.get("label")))
            if say is not None:
                say(f"ended runner {doc.get('label')} (group {group}): the agent is gone")
    return ended


def _say(line: str) -> None:
    # stderr is the agent's (its log): a closed pipe there must not stop the kills
    with contextlib.suppress(OSError):
        sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} oarbank tether: {line}\n")
        sys.stderr.flush()


def main(argv: list[str]) -> int:
    state_dir, fd = Path(argv[0]), int(argv[1])
    groups = platform.current().groups  # loaded before the wait: no import after the EOF
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    while os.read(fd, 4096):
        pass  # nothing is ever written: only EOF matters
    end_runners(state_dir / "procs", groups, _say)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
