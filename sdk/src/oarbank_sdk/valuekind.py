"""What kind of value something is, in words an error message can use ("got a list"), for
every checker that names what it found: the manifest (TOML), pages and conformance inputs
(JSON), the portal's heartbeat validation. One spelling, so the same mistake reads the same
everywhere; the one word that differs by format is the mapping's (JSON's "an object", TOML's
"a table"), which the caller names.
"""

from __future__ import annotations

import datetime
from typing import Any

__all__ = ["describe", "kind_of"]

OBJECT = "an object"  # JSON's word for a mapping
TABLE = "a table"  # TOML's


def kind_of(value: Any, *, mapping: str = OBJECT) -> str:
    """"null", "a boolean", "an integer", "a number", "a string", "a list", ``mapping`` (a
    dict: "an object", or TOML's "a table"), "a date/time" (TOML); for any other value its
    Python type name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return mapping
    if isinstance(value, (datetime.date, datetime.time)):
        return "a date/time"
    return type(value).__name__


def describe(value: Any, *, mapping: str = OBJECT) -> str:
    """``kind_of``, with a boolean, number or string shown: 'a boolean (true)', 'an integer
    (3)', 'a number (1.5)', 'a string ("10m")' (cut to 40 characters)."""
    kind = kind_of(value, mapping=mapping)
    if isinstance(value, bool):
        return f"{kind} ({'true' if value else 'false'})"
    if isinstance(value, (int, float)):
        return f"{kind} ({value})"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f'{kind} ("{shown}")'
    return kind
