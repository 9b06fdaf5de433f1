"""What an operator changed about this node's modules at run time, kept in
``<state>/modules.json`` so that an agent restart keeps it: the modules disabled
(``oarbank-agent module disable``), the module folders added (``module add``) and the modules
removed (``module remove``: not loaded again even when the command line names their folder,
until ``module add`` loads one again).

``{"disabled": ["<module id>", ...], "added": ["<module dir>", ...], "removed": ["<module
id>", ...]}``, written atomically (a file without ``removed`` reads as none removed). A
file that cannot be read is reported (the caller logs it, naming the file) and read as
nothing changed: the agent still starts, and the next change rewrites it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FILE", "Kept", "read", "write"]

FILE = "modules.json"


@dataclass
class Kept:
    disabled: set[str] = field(default_factory=set)
    added: list[str] = field(default_factory=list)
    removed: set[str] = field(default_factory=set)


def read(state_dir: Path) -> tuple[Kept, str | None]:
    """(what is kept, why the file could not be read or None)."""
    path = state_dir / FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Kept(), None
    except (OSError, ValueError) as exc:
        return Kept(), (f"{path}: unreadable ({exc}); no module is taken as disabled, added "
                        "or removed")
    if not isinstance(doc, dict):
        doc = {"disabled": None}
    lists = [doc.get(k, []) for k in ("disabled", "added", "removed")]
    if not all(isinstance(v, list) and all(isinstance(i, str) for i in v) for v in lists):
        return Kept(), (f'{path}: expected {{"disabled": [module id, ...], "added": [module '
                        'dir, ...], "removed": [module id, ...]}; no module is taken as '
                        'disabled, added or removed')
    return Kept(set(lists[0]), list(lists[1]), set(lists[2])), None


def write(state_dir: Path, kept: Kept) -> None:
    path = state_dir / FILE
    tmp = path.with_name(FILE + ".tmp")
    doc = {"disabled": sorted(kept.disabled), "added": kept.added,
           "removed": sorted(kept.removed)}
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
