"""A source's shaping options (UI contract: ``fields``, ``group_by`` with ``agg``, ``order_by``
with ``descending``, ``limit`` <= 200), read once and applied to rows in Python. The store
applies the same options in SQL for the queries it answers over many rows (``nodes``,
``node_metrics``: ``nodes.py``); ``shape_rows`` is what a fixture (preview) and the
``services`` query get, so a page shows the same either way.

- ``agg`` maps a field to one of ``count`` (its non-null values), ``sum``, ``mean``,
  ``median``, ``min``, ``max``, ``p95`` (nearest rank); with ``group_by`` one row per value of
  that field (the group's value and each aggregate, under the field's own name), without it one
  row for all rows.
- ``order_by`` sorts by a field (``descending`` defaults to true, as upstream's); nulls last.
- ``limit`` is at most 200; the default is 200.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AGGS", "MAX_LIMIT", "ShapeError", "Shaping", "aggregate", "read_shaping", "shape_rows",
           "sort_key"]

MAX_LIMIT = 200
AGGS = ("count", "mean", "median", "min", "max", "p95", "sum")
FIELD = re.compile(r"^[a-z][a-z0-9_]*$")


class ShapeError(ValueError):
    """A source's shaping options are malformed; the message names the option."""


@dataclass(frozen=True)
class Shaping:
    fields: tuple[str, ...] | None = None
    group_by: str | None = None
    agg: dict[str, str] = field(default_factory=dict)
    order_by: str | None = None
    descending: bool = True
    limit: int = MAX_LIMIT


def _name(v: Any, where: str) -> str:
    if not isinstance(v, str) or not FIELD.match(v):
        raise ShapeError(f"{where}: expected a field name (^[a-z][a-z0-9_]*$), got {v!r}")
    return v


def read_shaping(source: Any) -> Shaping:
    """The shaping options of a source object; ShapeError naming the first wrong one."""
    if not isinstance(source, dict):
        return Shaping()
    fields = source.get("fields")
    if fields is not None:
        if not isinstance(fields, list):
            raise ShapeError(f"fields: expected a list of field names, got {fields!r}")
        fields = tuple(_name(f, "fields") for f in fields)
    group_by = source.get("group_by")
    if group_by is not None:
        group_by = _name(group_by, "group_by")
    agg_raw = source.get("agg") or {}
    if not isinstance(agg_raw, dict):
        raise ShapeError(f"agg: expected an object of field -> aggregate, got {agg_raw!r}")
    agg = {}
    for k, fn in agg_raw.items():
        _name(k, "agg")
        if fn not in AGGS:
            raise ShapeError(f"agg.{k}: expected one of {', '.join(AGGS)}, got {fn!r}")
        agg[k] = fn
    if group_by is not None and not agg:
        raise ShapeError("group_by needs agg: which fields to aggregate, and how")
    order_by = source.get("order_by")
    if order_by is not None:
        order_by = _name(order_by, "order_by")
    desc = source.get("descending", True)
    if not isinstance(desc, bool):
        raise ShapeError(f"descending: expected true or false, got {desc!r}")
    limit = source.get("limit", MAX_LIMIT)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ShapeError(f"limit: expected a whole number from 1 to {MAX_LIMIT}, got {limit!r}")
    return Shaping(fields, group_by, agg, order_by, desc, limit)


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def aggregate(fn: str, values: list[Any]) -> Any:
    """One aggregate over a group's values (nulls skipped; non-numbers skipped but by count,
    min and max, which compare like values)."""
    present = [v for v in values if v is not None]
    if fn == "count":
        return len(present)
    if fn in ("min", "max"):
        try:
            return (min if fn == "min" else max)(present) if present else None
        except TypeError:  # mixed kinds: compare as text
            return (min if fn == "min" else max)(present, key=str)
    nums = sorted(n for n in (_num(v) for v in present) if n is not None)
    if not nums:
        return 0 if fn == "sum" else None
    if fn == "sum":
        s = float(sum(nums))
        return int(s) if s.is_integer() and all(isinstance(v, int) for v in present) else s
    if fn == "mean":
        return sum(nums) / len(nums)
    if fn == "median":
        mid = len(nums) // 2
        return nums[mid] if len(nums) % 2 else (nums[mid - 1] + nums[mid]) / 2
    # p95, nearest rank
    return nums[max(0, math.ceil(0.95 * len(nums)) - 1)]


def sort_key(v: Any) -> tuple[int, Any]:
    if v is None:
        return (2, "")
    n = _num(v)
    return (0, n) if n is not None else (1, str(v))


def shape_rows(rows: list[dict[str, Any]], s: Shaping) -> list[dict[str, Any]]:
    """Rows shaped by ``s`` (a new list; the rows given are not changed)."""
    out = rows
    if s.agg:
        groups: dict[Any, list[dict[str, Any]]] = {}
        for r in rows:
            key = r.get(s.group_by) if s.group_by is not None else None
            groups.setdefault(key if not isinstance(key, (list, dict)) else str(key), []).append(r)
        if s.group_by is None and not groups:
            groups[None] = []
        out = []
        for key in sorted(groups, key=sort_key):
            row: dict[str, Any] = {} if s.group_by is None else {s.group_by: key}
            for f, fn in s.agg.items():
                row[f] = aggregate(fn, [r.get(f) for r in groups[key]])
            out.append(row)
    if s.order_by is not None:
        by = s.order_by
        present = [r for r in out if r.get(by) is not None]
        nulls = [r for r in out if r.get(by) is None]
        present.sort(key=lambda r: sort_key(r.get(by)), reverse=s.descending)
        out = present + nulls
    if s.fields is not None:
        out = [{f: r[f] for f in s.fields if f in r} for r in out]
    return list(out[:s.limit])
