"""Relative times in preview fixtures: ``"-5m"`` is five minutes before the preview's now.

A fixture captured once would otherwise read "333 d ago" a year later. A row value that is
exactly ``"now"`` or ``-<number><unit>`` (unit ``s``, ``m``, ``h``, ``d``; ``"-1.5h"``) becomes
that unix time; every other value is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["UNITS", "resolve", "resolve_rows"]

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([smhd])$")


def resolve(value: Any, now: float) -> Any:
    """``value`` as a unix time when it is a relative time, else unchanged."""
    if not isinstance(value, str):
        return value
    if value == "now":
        return now
    m = _RELATIVE.match(value)
    return now - float(m.group(1)) * UNITS[m.group(2)] if m else value


def resolve_rows(rows: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    return [{k: resolve(v, now) for k, v in row.items()} for row in rows]
