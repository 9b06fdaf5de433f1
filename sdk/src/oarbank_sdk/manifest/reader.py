"""Typed reads from parsed TOML/JSON that record problems instead of raising.

The manifest and page checkers read every value through a ``Reader``: a wrong type, a missing
required key or an unknown key becomes a ``Problem`` at its key path and the read returns the
default, so checking goes on and every problem in the file is reported at once.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from typing import Any

from ..valuekind import TABLE, describe
from .model import Note, Problem

__all__ = ["MISSING", "Reader", "join"]

# Dots pass through so callers can join a sub-path ("provides.pools") in one go.
_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_.-]+$")


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def join(path: str, key: str | int) -> str:
    """``join("services[0]", "gpu")`` -> ``services[0].gpu``; ints become ``[n]``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    part = key if _PLAIN_KEY.match(key) else '"' + key.replace('"', '\\"') + '"'
    return f"{path}.{part}" if path else part


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and not (
        isinstance(v, float) and not math.isfinite(v)
    )


class Reader:
    """Collects problems; every ``get_*`` returns the value, or ``default`` after a problem."""

    def __init__(self, table_word: str = TABLE) -> None:
        self.problems: list[Problem] = []
        self.notes: list[Note] = []
        # "a table" for TOML, "an object" for JSON: the word people see in messages.
        self.table_word = table_word

    def add(self, key: str, message: str) -> None:
        self.problems.append(Problem(key, message))

    def note(self, key: str, message: str) -> None:
        """A key accepted without being acted on: said once, never an error."""
        self.notes.append(Note(key, message))

    # -- structure ---------------------------------------------------------------------------

    def known_keys(self, table: dict[str, Any], path: str, allowed: Iterable[str], what: str) -> None:
        allowed = list(allowed)
        for key in table:
            if key not in allowed:
                close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.75)
                hint = f"did you mean {close[0]!r}? " if close else ""
                self.add(join(path, key), f"unknown key; {hint}{what} takes: {', '.join(allowed)}")

    def get(
        self,
        table: dict[str, Any],
        key: str,
        path: str,
        default: Any = MISSING,
        required: bool = False,
    ) -> Any:
        value = table.get(key, MISSING)
        if value is MISSING and required:
            self.add(join(path, key), "required key is missing")
        return default if value is MISSING else value

    def _wrong(self, path: str, expected: str, value: Any) -> None:
        self.add(path, f"expected {expected}, got {describe(value, mapping=self.table_word)}")

    # -- typed reads (value already fetched; path is the value's own path) ----------------------

    def table(self, value: Any, path: str, default: Any = None) -> dict[str, Any] | None:
        if value is MISSING:
            return default
        if not isinstance(value, dict):
            self._wrong(path, self.table_word, value)
            return default
        return value

    def string(self, value: Any, path: str, default: Any = None, nonempty: bool = False) -> Any:
        if value is MISSING:
            return default
        if not isinstance(value, str):
            self._wrong(path, "a string", value)
            return default
        if nonempty and not value.strip():
            self.add(path, "must not be empty")
            return default
        return value

    def boolean(self, value: Any, path: str, default: Any = None) -> Any:
        if value is MISSING:
            return default
        if not isinstance(value, bool):
            self._wrong(path, "true or false", value)
            return default
        return value

    def positive_number(self, value: Any, path: str, default: Any = None) -> Any:
        if value is MISSING:
            return default
        if not _is_number(value):
            self._wrong(path, "a positive number of seconds" if path.endswith("_s") else
                        "a positive number", value)
            return default
        if value <= 0:
            self.add(path, f"must be greater than 0, got {value}")
            return default
        return float(value)

    def positive_int(self, value: Any, path: str, default: Any = None) -> Any:
        if value is MISSING:
            return default
        if not _is_int(value):
            self._wrong(path, "a positive integer", value)
            return default
        if value <= 0:
            self.add(path, f"must be a positive integer, got {value}")
            return default
        return value

    def string_list(self, value: Any, path: str, default: Any = (), nonempty: bool = False) -> Any:
        if value is MISSING:
            return default
        if not isinstance(value, list):
            self._wrong(path, "a list of strings", value)
            return default
        ok = True
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self._wrong(join(path, i), "a string", item)
                ok = False
        if nonempty and not value:
            self.add(path, "must not be empty")
            ok = False
        return tuple(value) if ok else default

    def int_list(self, value: Any, path: str, default: Any = (), nonempty: bool = False) -> Any:
        if value is MISSING:
            return default
        if not isinstance(value, list):
            self._wrong(path, "a list of integers", value)
            return default
        ok = True
        for i, item in enumerate(value):
            if not _is_int(item):
                self._wrong(join(path, i), "an integer", item)
                ok = False
        if nonempty and not value:
            self.add(path, "must not be empty")
            ok = False
        return tuple(value) if ok else default

    def one_of(self, value: Any, path: str, choices: Iterable[str], default: Any = None) -> Any:
        if value is MISSING:
            return default
        choices = list(choices)
        if not isinstance(value, str):
            self._wrong(path, "one of " + ", ".join(f'"{c}"' for c in choices), value)
            return default
        if value not in choices:
            self.add(path, f'"{value}" is not one of ' + ", ".join(f'"{c}"' for c in choices))
            return default
        return value
