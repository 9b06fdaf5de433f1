"""Pure numbers: medians, p99, ratios, and the one record every metric of every figure is.

A metric (one row of the table, one entry of results.json)::

    {"unit": "ms", "median": 1.2, "p99": 3.4 | None, "baseline": 1.0 | None,
     "baseline_p99": ... | None, "ratio": 1.2 | None, "baseline_name": "loopback TCP",
     "samples": 300, "targets": {"ratio": "<= 1.25"}, "ok": True | False | None}

``ratio`` is always ours / baseline (median over median), whatever the unit; each target is a
bound on one field of the record, checked by ``check_target``.
"""

from __future__ import annotations

import math
import operator
import statistics
from collections.abc import Sequence
from typing import Any

__all__ = ["median", "p99", "percentile", "ratio", "metric", "check_target"]

_OPS = {"<=": operator.le, ">=": operator.ge, "==": operator.eq}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def p99(values: Sequence[float]) -> float | None:
    return percentile(values, 99)


def ratio(ours: float | None, base: float | None) -> float | None:
    if ours is None or base is None or base == 0:
        return None
    return ours / base


def check_target(value: float | None, target: str | None) -> bool | None:
    """``target`` like ``"<= 1.25"``; None when there is no target or no value."""
    if target is None or value is None:
        return None
    op, _, bound = target.partition(" ")
    if op not in _OPS:
        raise ValueError(f"target {target!r}: expected '<= X', '>= X' or '== X'")
    return bool(_OPS[op](value, float(bound)))


def metric(samples: Sequence[float], *, unit: str, scale: float = 1.0,
           baseline: Sequence[float] | None = None, baseline_name: str | None = None,
           with_p99: bool = True, targets: dict[str, str] | None = None,
           note: str | None = None) -> dict[str, Any]:
    """One metric from raw samples (and the baseline's raw samples), values times ``scale``.

    ``targets`` maps a field (``median``, ``p99``, ``ratio``) to a bound like ``"<= 1.25"``;
    ``ok`` is True when every one holds, False when one fails, None without targets.
    """
    med = median(samples)
    rec: dict[str, Any] = {
        "unit": unit,
        "median": None if med is None else med * scale,
        "p99": None,
        "baseline": None,
        "baseline_p99": None,
        "baseline_name": baseline_name,
        "ratio": None,
        "samples": len(samples),
        "targets": dict(targets or {}),
        "ok": None,
    }
    if with_p99 and samples:
        rec["p99"] = p99(samples) * scale  # type: ignore[operator]
    if baseline:
        bmed = median(baseline)
        rec["baseline"] = None if bmed is None else bmed * scale
        if with_p99:
            rec["baseline_p99"] = p99(baseline) * scale  # type: ignore[operator]
        rec["ratio"] = ratio(med, bmed)
    if note:
        rec["note"] = note
    if targets:
        checks = [check_target(rec.get(field), bound) for field, bound in targets.items()]
        rec["ok"] = None if None in checks else all(checks)
    return rec
