"""The host rules of ``oarbank-agent protect`` (``--forbid-gpu``, ``--evict``), kept in
``<state>/host_rules.json`` so that an agent restart keeps them: an operator who evicted the
node's services for maintenance does not want them back because the agent restarted.

``{"gpu_forbidden": bool, "evicted": bool}`` (``Guard.rules``), written atomically after each
change. ``rules_to_apply`` (pure) turns it into the ``protect`` rules a new agent sets at start;
a file that cannot be read is reported (the caller logs it) and sets nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["FILE", "read", "write", "rules_to_apply"]

FILE = "host_rules.json"


def read(state_dir: Path) -> tuple[dict[str, Any], str | None]:
    """(the kept rules, why the file could not be read or None)."""
    path = state_dir / FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as exc:
        return {}, f"{path}: unreadable ({exc}); no host rule restored"
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k, False), bool)
                                            for k in ("gpu_forbidden", "evicted")):
        return {}, (f'{path}: expected {{"gpu_forbidden": true|false, "evicted": true|false}}; '
                    "no host rule restored")
    return doc, None


def write(state_dir: Path, rules: dict[str, Any]) -> None:
    path = state_dir / FILE
    tmp = path.with_name(FILE + ".tmp")
    tmp.write_text(json.dumps(rules) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def rules_to_apply(kept: dict[str, Any]) -> list[str]:
    """The ``protect`` rules that restore ``kept`` on an agent that starts with none."""
    return (["forbid-gpu"] if kept.get("gpu_forbidden") else []) + (
        ["evict"] if kept.get("evicted") else [])
