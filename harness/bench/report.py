"""results.json and the printed table (pure formatting plus one atomic write)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .profile import lines as profile_lines

__all__ = ["table", "where_time_goes", "write_results"]

COLUMNS = ["figure", "metric", "unit", "median", "p99", "baseline", "ratio", "target", "ok"]


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        a = abs(v)
        if a >= 1000:
            return f"{v:.0f}"
        if a >= 10:
            return f"{v:.1f}"
        if a >= 0.1 or a == 0:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for fig_key, fig in results["figures"].items():
        label = fig.get("title", fig_key)
        if fig.get("error"):
            out.append([label, "ERROR", "", fig["error"][:60], "", "", "", "", "NO"])
            continue
        for name, m in fig["metrics"].items():
            target = ", ".join(f"{k} {v}" for k, v in (m.get("targets") or {}).items())
            out.append([label, name, m.get("unit", ""), _num(m.get("median")), _num(m.get("p99")),
                        _num(m.get("baseline")), _num(m.get("ratio")), target or "-",
                        _num(m.get("ok"))])
            label = ""  # the figure's name once, on its first row
    return out


def table(results: dict[str, Any]) -> str:
    body = rows(results)
    widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c)
              for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def where_time_goes(results: dict[str, Any]) -> list[str]:
    """For each figure with a missed target: its missed metrics and the agent's profile of it
    (``--profile``), else how to get one."""
    out: list[str] = []
    for key, fig in results["figures"].items():
        missed = [n for n, m in fig.get("metrics", {}).items() if m.get("ok") is False]
        if not missed:
            continue
        out.append(f"- {fig.get('title', key)}: missed {', '.join(missed)}")
        extra = fig.get("where") or []
        out += [f"  {line}" for line in extra]
        if fig.get("profile"):
            out += [f"  {line}" for line in profile_lines(key, fig["profile"])]
        else:
            out.append(f"  (run with --profile DIR --only {key} for the agent's profile)")
    return out


def write_results(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
