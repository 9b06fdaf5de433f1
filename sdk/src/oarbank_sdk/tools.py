"""The host tools this module was granted on this node (``OARBANK_TOOLS_FILE``), by upstream's
names (``from oarbank_sdk import tools``). Standard library only.

    tools.path("jdk")      # the granted installation's canonical path; ToolMissing if none
    tools.version("jdk")   # as the node detected it, or None

The file maps each granted tool id to its installations: ``{"jdk": [{"path": ..., "version":
..., "arch": ...}]}`` (a bare path string counts as ``{"path": ...}``). A process started
without the variable sees no tools. This agent grants none yet: its file is ``{}``.
"""

from __future__ import annotations

from typing import Any

from ._envfile import json_object

__all__ = ["ENV", "ToolMissing", "all_tools", "arch", "installations", "path", "paths",
           "version"]

ENV = "OARBANK_TOOLS_FILE"


class ToolMissing(LookupError):
    """The tool is not granted to this module on this node."""


def _installation(tool_id: str, entry: Any) -> dict[str, Any]:
    if isinstance(entry, str):
        return {"path": entry}
    if isinstance(entry, dict) and isinstance(entry.get("path"), str):
        return dict(entry)
    raise ValueError(f"{ENV}: tool {tool_id!r} has an installation that is neither a path "
                     f"nor an object with a 'path': {entry!r}")


def all_tools() -> dict[str, list[dict[str, Any]]]:
    """Every granted tool id and its installations ({} when the variable is unset)."""
    out = {}
    for tool_id, entries in json_object(ENV).items():
        if not isinstance(entries, list):
            raise ValueError(f"{ENV}: tool {tool_id!r} must list its installations")
        out[str(tool_id)] = [_installation(tool_id, e) for e in entries]
    return out


def installations(tool_id: str) -> list[dict[str, Any]]:
    """The installations granted for ``tool_id`` ([] when none)."""
    return all_tools().get(tool_id, [])


def paths(tool_id: str) -> list[str]:
    return [i["path"] for i in installations(tool_id)]


def _first(tool_id: str) -> dict[str, Any]:
    found = installations(tool_id)
    if not found:
        raise ToolMissing(f"tool {tool_id!r} is not granted to this module on this node "
                          "(declare it in [sandbox].tools)")
    return found[0]


def path(tool_id: str) -> str:
    """The first granted installation's path; ``ToolMissing`` when there is none."""
    return str(_first(tool_id)["path"])


def version(tool_id: str) -> str | None:
    value = _first(tool_id).get("version")
    return value if isinstance(value, str) else None


def arch(tool_id: str) -> str | None:
    value = _first(tool_id).get("arch")
    return value if isinstance(value, str) else None
