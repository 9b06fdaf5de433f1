"""The JSON object in the file an environment variable names: how the agent hands a runner
what it was granted (secrets, tools, folders). Standard library only."""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["json_object"]


def json_object(env: str) -> dict[str, Any]:
    """The object in the file ``env`` names; ``{}`` when the variable is unset (nothing granted).
    ``ValueError`` naming the variable when the file holds anything but an object."""
    where = os.environ.get(env)
    if not where:
        return {}
    with open(where, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict):
        raise ValueError(f"{env} ({where}) must hold a JSON object")
    return doc
