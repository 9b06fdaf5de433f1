"""The node's id, kept in the state dir after the first run.

A node that reports under a new id is a new node on the portal (and its old one goes stale),
so the id is not left to whoever types the command next: the first run writes
``<state>/node_id``; a later run without ``--node-id`` uses it, and one with a different
``--node-id`` is refused unless ``--rename-node`` says the change is meant.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

__all__ = ["FILE_NAME", "NodeIdError", "resolve"]

FILE_NAME = "node_id"


class NodeIdError(ValueError):
    pass


def _check(node_id: str, where: str) -> str:
    if not node_id or node_id != node_id.strip() or any(c.isspace() for c in node_id) \
            or len(node_id) > 253:
        raise NodeIdError(f"{where}: {node_id!r} is not a node id (1 to 253 characters, "
                          "no spaces)")
    return node_id


def resolve(state_dir: Path, given: str | None, *, rename: bool = False) -> tuple[str, str]:
    """(the node id to run under, what happened: kept|new|renamed). Writes the file when the
    id is new or renamed; never otherwise. Raises NodeIdError."""
    path = state_dir / FILE_NAME
    try:
        kept: str | None = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        kept = None
    except OSError as exc:
        raise NodeIdError(f"cannot read {path}: {exc.strerror}") from None
    if given is not None:
        _check(given, "--node-id")
    if kept:
        _check(kept, str(path))
        if given is None or given == kept:
            return kept, "kept"
        if not rename:
            raise NodeIdError(
                f"--node-id {given}: this state dir belongs to node {kept} ({path}); a new id "
                "makes a new node on the portal. Give --rename-node to rename it, or drop "
                "--node-id")
        _write(path, given)
        return given, "renamed"
    node_id = given or socket.gethostname()
    _check(node_id, "--node-id" if given else "the host name")
    _write(path, node_id)
    return node_id, "new"


def _write(path: Path, node_id: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(node_id + "\n", encoding="utf-8")
    os.replace(tmp, path)
