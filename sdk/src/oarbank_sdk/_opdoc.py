"""What a service op answered (contract section 2): its stdout is one JSON document, the last
line that parses as a JSON object. One reading shared by the agent and the conformance kit, so
the kit judges a module exactly as the agent will."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["last_json_object"]


def last_json_object(text: str) -> dict[str, Any] | None:
    """The last line of ``text`` that parses as a JSON object (surrounding space ignored)."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None
