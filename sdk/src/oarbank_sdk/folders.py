"""The host folders a runner was granted on this node (``OARBANK_FOLDERS_FILE``), by upstream's
names (``from oarbank_sdk import folders``). Standard library only.

    folders.path("inputs")             # read access
    folders.path("outbox", "write")    # write access

The file maps each granted folder id to ``{"path": ..., "access": "read" | "write"}``. This
agent grants no folders yet: it sets no such file, so every lookup raises ``FolderMissing``.
"""

from __future__ import annotations

import os
from typing import Any

from ._envfile import json_object

__all__ = ["ENV", "FolderMissing", "all_folders", "path"]

ENV = "OARBANK_FOLDERS_FILE"


class FolderMissing(LookupError):
    """The folder is not granted here with the access asked for."""


def all_folders() -> dict[str, dict[str, Any]]:
    """Every granted folder id and its ``{path, access}`` ({} when the variable is unset)."""
    doc = json_object(ENV)
    if not all(isinstance(v, dict) for v in doc.values()):
        raise ValueError(f"{ENV} ({os.environ[ENV]}) must map folder ids to objects")
    return {str(k): dict(v) for k, v in doc.items()}


def path(folder_id: str, access: str = "read") -> str:
    """The folder's path when granted with ``access``; ``FolderMissing`` otherwise."""
    found = all_folders().get(folder_id)
    if not found or found.get("access") != access or not isinstance(found.get("path"), str):
        raise FolderMissing(f"folder {folder_id!r} is not granted with {access} access on "
                            "this node (declare it in [sandbox].folders)")
    return str(found["path"])
