"""What every ``oarbank-agent`` command that talks to a running agent shares: its error line,
its exit codes and one control request.

Exit codes: 1 the agent is not running (or was lost), 3 not permitted to reach it (its control
socket is its user's alone): distinct, so a script can tell "start it" from "run me as its
user".
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from oarbank_agent.operate import control

__all__ = ["EXIT_NOT_PERMITTED", "EXIT_NOT_RUNNING", "err", "not_permitted", "request"]

EXIT_NOT_RUNNING = 1
EXIT_NOT_PERMITTED = 3


def err(msg: str) -> None:
    print(f"oarbank-agent: {msg}", file=sys.stderr)


def not_permitted(state_dir: Path) -> str:
    try:
        from oarbank_agent import platform

        uid = state_dir.stat().st_uid
        owner = platform.current().statedir.user_name(uid) or str(uid)
        who = f"user {owner}; e.g. `sudo -u {owner} oarbank-agent ...`"
    except OSError:  # not even its path may be looked at: its parent is closed to us too
        who = "the agent's user (the owner of the state dir)"
    return (f"not permitted to reach the agent of {state_dir}: its control socket is open "
            f"only to the agent's user (the state dir is 0700); run this command as {who}")


def request(state_dir: Path, req: dict[str, Any],
            timeout: float | None = 30.0) -> dict[str, Any] | int:
    """One control request; an int is the exit code, its reason already printed.
    ``timeout``: seconds for the answer (None: as long as it takes)."""
    try:
        return control.request(state_dir, req, timeout)
    except control.AgentNotRunning as exc:
        err(str(exc))
        return EXIT_NOT_RUNNING
    except PermissionError:
        err(not_permitted(state_dir))
        return EXIT_NOT_PERMITTED
    except (OSError, ValueError) as exc:
        err(f"lost the agent: {exc}")
        return 1
