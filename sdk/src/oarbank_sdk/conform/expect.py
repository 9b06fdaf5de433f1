"""``expect.body`` of a ``service_specs`` entry: the answer's JSON must contain it.

A subset, recursively: every key of an expected object must be in the answer's object with a
matching value (other keys of the answer are ignored); a list must match element by element
(same length); anything else must be equal. ``body_problem`` names the first place that
differs, as a JSON path (``body.items[0].score``), with what was expected and what was found.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["body_problem", "subset_problem"]


def _short(value: Any, n: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= n else text[: n - 3] + "..."


def subset_problem(want: Any, got: Any, path: str = "body") -> str | None:
    """Where ``got`` does not contain ``want`` (None when it does)."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{path}: expected an object, got {_short(got)}"
        for key, value in want.items():
            if key not in got:
                return f"{path}.{key}: missing (expected {_short(value)})"
            problem = subset_problem(value, got[key], f"{path}.{key}")
            if problem:
                return problem
        return None
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"{path}: expected {_short(want)}, got {_short(got)}"
        for i, (w, g) in enumerate(zip(want, got, strict=True)):
            problem = subset_problem(w, g, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if want != got or isinstance(want, bool) != isinstance(got, bool):
        return f"{path}: expected {_short(want)}, got {_short(got)}"
    return None


def body_problem(want: Any, body: bytes) -> str | None:
    """``want`` against an answer's raw body (which must be JSON)."""
    try:
        got = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return f"body: expected JSON containing {_short(want)}, got {body[:120]!r}"
    return subset_problem(want, got)
