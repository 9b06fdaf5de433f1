"""Values as text: column types, format strings and the tones a column's ``direction`` gives.

Types: ``text``, ``integer``, ``number``, ``percent`` (a fraction: 0.25 is 25%), ``bytes``,
``duration`` (seconds), ``status``, ``code``, ``digest`` (shortened, the whole on hover),
``relative_time``, ``timestamp``, ``bool``, ``node_ref`` (a link to the node's panel when the
portal has one); other types are shown as text. Formats (upstream's): ``.Nf`` (N decimals),
``.Ne`` (exponent), ``.N%`` (a fraction as a percentage), ``d`` (whole), ``,d`` (thousands
separated), ``s`` (as text), ``d/d`` (a pair ``[done, total]`` as ``3/8``), each with an
optional leading ``+`` (the sign always shown). A value of the wrong type renders "—"; a format
this console does not know renders the value by its type alone.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from typing import Any

from .base import WRONG

__all__ = ["COLUMN_TYPES", "DEFAULT_TONES", "TONES", "ago_text", "apply_format", "cell",
           "direction_tones", "format_cell", "is_number", "iso_text", "tone_for", "when_of"]

TONES = ("ok", "warn", "error", "info", "neutral", "running")
COLUMN_TYPES = ("text", "integer", "number", "percent", "bytes", "duration", "status", "code",
                "digest", "relative_time", "timestamp", "bool", "node_ref")
# Tones for well-known values when a status column or component gives none.
DEFAULT_TONES = {
    "ready": "ok", "healthy": "ok", "ok": "ok", "true": "ok",
    "starting": "running", "running": "running",
    "stopped": "neutral", "idle": "neutral",
    "unhealthy": "error", "error": "error", "failed": "error", "withdrawn": "error",
    "held": "warn", "disabled": "warn", "false": "neutral",
    # "unknown" is what a stale node's rows answer (contract 6.3): a warning, not news.
    "undetected": "info", "unknown": "warn",
}
_FORMAT = re.compile(r"^(\+)?(?:\.(\d{1,2})([fe%])|(,?d)|(s)|(d/d))$")


def cell(text: str, ctype: str, *, tone: str | None = None, title: str | None = None,
         wrong: bool = False, href: str | None = None) -> dict[str, Any]:
    out = {"text": text, "type": ctype, "tone": tone, "title": title, "wrong": wrong}
    if href is not None:
        out["href"] = href
    return out


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def when_of(v: Any) -> float | None:
    """Unix seconds from a number or an ISO 8601 string; None when it is neither."""
    if is_number(v):
        return float(v)
    if isinstance(v, str):
        try:
            d = _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            return None
        if d.tzinfo is None:
            d = d.replace(tzinfo=_dt.timezone.utc)
        return d.timestamp()
    return None


def iso_text(t: float) -> str:
    try:
        return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return WRONG


def ago_text(delta: float) -> str:
    future = delta < 0
    d = abs(delta)
    if d < 1:
        return "just now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if d >= size:
            n = int(d // size)
            return f"in {n} {unit}" if future else f"{n} {unit} ago"
    return "just now"  # pragma: no cover - unreachable


def tone_for(value: str, tones: Any) -> str:
    if isinstance(tones, dict):
        t = tones.get(value)
        if t in TONES:
            return str(t)
    return DEFAULT_TONES.get(value.lower(), "neutral")


def apply_format(value: Any, fmt: str) -> str | None:
    """``value`` in format ``fmt``; None when the format does not apply to it (the caller
    shows "—" for a wrong value, the plain type for an unknown format)."""
    m = _FORMAT.match(fmt)
    if not m:
        return None
    plus = "+" if m.group(1) else ""
    if m.group(6):  # d/d
        if (isinstance(value, (list, tuple)) and len(value) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in value)):
            return f"{value[0]:{plus}d}/{value[1]:d}"
        return None
    if m.group(5):  # s
        return str(value)
    if not is_number(value):
        return None
    if m.group(4):  # d or ,d
        sep = "," if m.group(4).startswith(",") else ""
        return f"{round(value):{plus}{sep}d}"
    digits, kind = int(m.group(2)), m.group(3)
    if kind == "%":
        return f"{value * 100:{plus}.{digits}f}%"
    return f"{value:{plus}.{digits}{kind}}"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover - unreachable


def _duration(s: float) -> str:
    s = abs(s)
    if s < 60:
        return f"{s:.3g} s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            parts.append(f"{int(s // size)} {unit}")
            s %= size
    return " ".join(parts[:2])


def _plain_number(v: int | float) -> str:
    return str(v) if isinstance(v, int) else f"{v:.6g}"


def format_cell(value: Any, ctype: Any, *, now: float, tones: Any = None, missing: bool = False,
                fmt: Any = None, unit: Any = None, resolve: Any = None) -> dict[str, Any]:
    """One value formatted for a column type (and format); wrong type -> "—", null -> empty."""
    kind = ctype if isinstance(ctype, str) and ctype in COLUMN_TYPES else "text"
    if missing:
        return cell(WRONG, kind, title="no such field in the row", wrong=True)
    if value is None:
        return cell("", kind)
    wrong = cell(WRONG, kind, title=f"not a valid {kind} value", wrong=True)
    suffix = f" {unit}" if isinstance(unit, str) and unit else ""
    if isinstance(fmt, str) and fmt and kind not in ("status", "relative_time", "timestamp"):
        text = apply_format(value, fmt)
        if text is not None:
            return cell(text + suffix, kind)
        if _FORMAT.match(fmt):
            return cell(WRONG, kind, title=f"{value!r} cannot be shown as {fmt}", wrong=True)
    if kind == "integer":
        if isinstance(value, int) and not isinstance(value, bool):
            return cell(str(value) + suffix, kind)
        return wrong
    if kind == "number":
        return cell(_plain_number(value) + suffix, kind) if is_number(value) else wrong
    if kind == "percent":
        return cell(f"{value * 100:.0f}%", kind) if is_number(value) else wrong
    if kind == "bytes":
        return cell(_bytes(value), kind, title=f"{value} bytes") if is_number(value) else wrong
    if kind == "duration":
        return cell(_duration(value), kind) if is_number(value) else wrong
    if kind == "bool":
        return cell("yes" if value else "no", kind) if isinstance(value, bool) else wrong
    if kind == "status":
        if isinstance(value, str):
            return cell(value, kind, tone=tone_for(value, tones))
        if isinstance(value, bool):
            text = "true" if value else "false"
            return cell(text, kind, tone=tone_for(text, tones))
        return wrong
    if kind in ("code", "digest"):
        if isinstance(value, str) or is_number(value):
            text = str(value)
            if kind == "digest" and len(text) > 16:
                return cell(text[:12] + "…", kind, title=text)
            return cell(text, kind)
        return wrong
    if kind in ("relative_time", "timestamp"):
        t = when_of(value)
        if t is None:
            return wrong
        iso = iso_text(t)
        if kind == "timestamp":
            return cell(iso, kind)
        return cell(ago_text(now - t), kind, title=iso)
    if kind == "node_ref":
        if not isinstance(value, str) or not value:
            return wrong
        href = resolve(value) if resolve is not None else None
        return cell(value, kind, href=href)
    # text, and column types this console does not know ("and more"): shown as text.
    if isinstance(value, str):
        return cell(value + suffix, kind)
    if isinstance(value, bool):
        return cell("true" if value else "false", kind)
    if is_number(value):
        return cell(_plain_number(value) + suffix, kind)
    if isinstance(value, list):
        return _list_cell(value, kind, suffix)
    return wrong


def _list_cell(items: list[Any], kind: str, suffix: str) -> dict[str, Any]:
    """A list of texts, numbers or booleans (upstream's ``gpu_apis_host``) as its items joined
    by commas; a list holding an object or a list is not text."""
    parts = []
    for v in items:
        if isinstance(v, bool):
            parts.append("true" if v else "false")
        elif isinstance(v, str):
            parts.append(v)
        elif is_number(v):
            parts.append(_plain_number(v))
        else:
            return cell(WRONG, kind, title="a list holding an object or a list: not a valid "
                        f"{kind} value", wrong=True)
    if not parts:
        return cell("", kind, title="an empty list")
    return cell(", ".join(parts) + suffix, kind, title=f"a list of {len(parts)}")


def direction_tones(values: list[Any], direction: Any, by_sign: bool = False
                    ) -> list[tuple[str | None, str | None]]:
    """(tone, title) per value of a column with ``direction`` (``max``: higher is better,
    ``min``: lower is). The best value is ``ok`` ("best"), the worst ``warn`` ("worst") when
    the values differ; with ``tone_by_sign`` a value on the good side of zero is ``ok`` and
    on the bad side ``error`` instead."""
    out: list[tuple[str | None, str | None]] = [(None, None)] * len(values)
    if direction not in ("min", "max"):
        return out
    sign = 1 if direction == "max" else -1
    nums = [(i, float(v)) for i, v in enumerate(values) if is_number(v)]
    if by_sign:
        for i, v in nums:
            if v * sign > 0:
                out[i] = ("ok", "better")
            elif v * sign < 0:
                out[i] = ("error", "worse")
        return out
    if len({v for _, v in nums}) < 2:
        return out
    best = max(v * sign for _, v in nums)
    worst = min(v * sign for _, v in nums)
    for i, v in nums:
        if v * sign == best:
            out[i] = ("ok", "best")
        elif v * sign == worst:
            out[i] = ("warn", "worst")
    return out
