"""What kind of JSON value something is, in words an error message can use ("got a list").

One spelling for every checker that names what it found (pages, conformance inputs, the
portal's heartbeat validation), so the same mistake reads the same everywhere.
"""

from __future__ import annotations

from typing import Any

__all__ = ["kind_of"]


def kind_of(value: Any) -> str:
    """"null", "a boolean", "a number", "a string", "a list" or "an object"; for a value
    JSON cannot hold, its Python type name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
