"""Which modules an operator disabled on this node (``oarbank-agent module disable``), kept in
``<state>/modules.json`` so that an agent restart keeps them disabled.

``{"disabled": ["<module id>", ...]}``, written atomically. A file that cannot be read is
reported (the caller logs it, naming the file) and read as nothing disabled: the agent still
starts, and the next change rewrites it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["FILE", "read_disabled", "write_disabled"]

FILE = "modules.json"


def read_disabled(state_dir: Path) -> tuple[set[str], str | None]:
    """(the disabled module ids, why the file could not be read or None)."""
    path = state_dir / FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return set(), None
    except (OSError, ValueError) as exc:
        return set(), f"{path}: unreadable ({exc}); no module is taken as disabled"
    ids = doc.get("disabled") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return set(), (f'{path}: expected {{"disabled": [module id, ...]}}; no module is '
                       "taken as disabled")
    return set(ids), None


def write_disabled(state_dir: Path, disabled: set[str]) -> None:
    path = state_dir / FILE
    tmp = path.with_name(FILE + ".tmp")
    tmp.write_text(json.dumps({"disabled": sorted(disabled)}, indent=1) + "\n",
                   encoding="utf-8")
    os.replace(tmp, path)
