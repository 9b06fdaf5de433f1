"""``chart``: ``line``, ``bar``, ``scatter`` and ``histogram`` drawn here as SVG (no script,
from the module or from the portal), with the required text ``summary`` beside it.

Props: ``kind``, ``source``, ``x`` (a field), ``y`` (1 to 6 fields), ``summary`` (required:
the text alternative, also the caption); optional ``labels`` (a legend name per ``y``),
``format`` (the y axis' values) or ``axis`` (their type: ``bytes``, ``duration``,
``percent``), ``bins`` (histogram, 2 to 50, default 10). The x axis is
time when every x value is a time (unix seconds are numbers, so a field named ``t``, ``time``
or ending in ``_at`` is read as time), numbers when every one is a number, else categories.
A y value that is not a number is not drawn, and the caption says how many were left out;
a null is a bucket without a value (a gap in a line). Times are UTC.

Accessibility: the ``svg`` has ``role="img"`` named by the summary (``<title>``) and
described by what it plots (``<desc>``); series differ by dash pattern and marker as well
as colour; the figure carries the same data as a table in a ``<details>``.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from markupsafe import Markup, escape

from .base import RenderContext, SourceFailed, malformed, rows_of, string_prop
from .formats import apply_format, format_cell, is_number, when_of

__all__ = ["KINDS", "chart"]

KINDS = ("line", "bar", "scatter", "histogram")
W, H = 640, 220
LEFT, RIGHT, TOP, BOTTOM = 60, 14, 12, 34
MAX_SERIES = 6


def _value(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    return float(v) if is_number(v) else None


def _nice(lo: float, hi: float, n: int = 4) -> list[float]:
    if lo == hi:
        lo, hi = (lo - 1, hi + 1) if lo else (0.0, 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    t = start
    while t < hi + step * 0.999:
        ticks.append(round(t, 10))
        t += step
    return ticks


def _short(v: float, fmt: str) -> str:
    if fmt in ("bytes", "duration", "percent"):  # an axis of a value type (chart "axis")
        return str(format_cell(v, fmt, now=0.0)["text"])
    if fmt:
        text = apply_format(v, fmt)
        if text is not None:
            return text
    a = abs(v)
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:.3g}{unit}"
    return f"{v:.3g}"


def _time_text(t: float, span: float) -> str:
    d = _dt.datetime.fromtimestamp(t, _dt.timezone.utc)
    return d.strftime("%H:%M" if span <= 2 * 86400 else "%m-%d")


class _Frame:
    def __init__(self, x0: float, x1: float, y0: float, y1: float) -> None:
        self.x0, self.x1, self.y0, self.y1 = x0, x1, y0, y1

    def px(self, x: float) -> float:
        span = self.x1 - self.x0 or 1.0
        return LEFT + (x - self.x0) / span * (W - LEFT - RIGHT)

    def py(self, y: float) -> float:
        span = self.y1 - self.y0 or 1.0
        return H - BOTTOM - (y - self.y0) / span * (H - TOP - BOTTOM)


def _axes(f: _Frame, yticks: list[float], xlabels: list[tuple[float, str]], fmt: str) -> list[str]:
    out = [f'<line class="axis" x1="{LEFT}" y1="{H - BOTTOM}" x2="{W - RIGHT}" y2="{H - BOTTOM}"/>',
           f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{H - BOTTOM}"/>']
    for t in yticks:
        y = f.py(t)
        out.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f'{escape(_short(t, fmt))}</text>')
    shown = set()
    for x, label in xlabels:
        if label in shown:  # ticks closer than the labels' resolution: say each once
            continue
        shown.add(label)
        anchor = "end" if x > W - RIGHT - 30 else "middle"
        out.append(f'<text class="tick" x="{x:.1f}" y="{H - BOTTOM + 16}" text-anchor="{anchor}">'
                   f'{escape(label[:14])}</text>')
    return out


def _xkind(xs: list[Any], xname: str) -> str:
    present = [x for x in xs if x is not None]
    timeish = xname in ("t", "time", "at") or xname.endswith(("_at", "_time"))
    if present and all(isinstance(x, str) and when_of(x) is not None for x in present):
        return "time"
    if present and all(is_number(x) for x in present):
        return "time" if timeish else "number"
    return "category"


def _points_svg(rows: list[dict[str, Any]], x: str, ys: list[str], kind: str,
                fmt: str) -> tuple[list[str], int]:
    xs_raw = [r.get(x) for r in rows]
    xk = _xkind(xs_raw, x)
    skipped = 0
    if kind == "bar" or xk == "category":
        cats = list(dict.fromkeys(str(v) for v in xs_raw))
        pos = {c: i for i, c in enumerate(cats)}
        xnum = [float(pos[str(v)]) for v in xs_raw]
        x0, x1 = -0.5, len(cats) - 0.5
    else:
        xnum = [when_of(v) if xk == "time" else _value(v) for v in xs_raw]  # type: ignore[misc]
        present = [v for v in xnum if v is not None]
        x0, x1 = (min(present), max(present)) if present else (0.0, 1.0)
        if xk == "time" and x1 - x0 < 600:  # a few points in time: ten minutes around them
            mid = (x0 + x1) / 2
            x0, x1 = mid - 300, mid + 300
        elif x0 == x1:
            x0, x1 = x0 - 1, x1 + 1
    series: list[list[tuple[float, float | None]]] = []
    for y in ys:
        pts: list[tuple[float, float | None]] = []
        for xv, r in zip(xnum, rows, strict=True):
            raw = r.get(y)
            yv = _value(raw)
            if xv is None or (yv is None and raw is not None):
                skipped += 1  # no place on the axis, or not a number
                continue
            pts.append((xv, yv))  # None: no value in that bucket, a gap in a line
        pts.sort(key=lambda p: p[0])
        series.append(pts)
    values = [v for s in series for _, v in s if v is not None]
    lo = min([0.0, *values]) if values else 0.0
    hi = max([*values, lo + 1.0]) if values else 1.0
    yticks = _nice(lo, hi)
    f = _Frame(x0, x1, min(yticks[0], lo), max(yticks[-1], hi))
    if kind == "bar" or xk == "category":
        step = max(1, math.ceil(len(cats) / 8))
        got = [when_of(v) for v in dict.fromkeys(xs_raw)] if xk == "time" else []
        times = [t for t in got if t is not None] if None not in got else []
        span = (max(times) - min(times)) if times else 0.0
        xlabels = [(f.px(i), _time_text(times[i], span) if times else c)
                   for i, c in enumerate(cats) if i % step == 0]
    elif xk == "time":
        xlabels = [(f.px(t), _time_text(t, x1 - x0) + (" UTC" if k == 4 else ""))
                   for k, t in enumerate(x0 + (x1 - x0) * k / 4 for k in range(5))]
    else:
        xlabels = [(f.px(t), _short(t, "")) for t in _nice(x0, x1) if x0 <= t <= x1]
    out = _axes(f, yticks, xlabels, fmt)
    for i, pts in enumerate(series):
        cls = f"series s{i}"
        known = [(a, b) for a, b in pts if b is not None]
        if kind == "line":
            run: list[tuple[float, float]] = []
            for a, b in [*pts, (0.0, None)]:  # a null ends a run: the line has a gap there
                if b is not None:
                    run.append((a, b))
                    continue
                if len(run) > 1:
                    path = " ".join(f"{f.px(x):.1f},{f.py(y):.1f}" for x, y in run)
                    out.append(f'<polyline class="{cls}" points="{path}"/>')
                elif run:
                    out.append(f'<circle class="{cls} dot" cx="{f.px(run[0][0]):.1f}" '
                               f'cy="{f.py(run[0][1]):.1f}" r="2.5"/>')
                run = []
            if len(known) <= 40:
                out += [f'<circle class="{cls} dot" cx="{f.px(a):.1f}" cy="{f.py(b):.1f}" r="2.5"/>'
                        for a, b in known]
        elif kind == "scatter":
            out += [f'<circle class="{cls} dot" cx="{f.px(a):.1f}" cy="{f.py(b):.1f}" r="3.5"/>'
                    for a, b in known]
        elif kind == "bar":
            slot = (f.px(1) - f.px(0)) * 0.8
            width = slot / max(1, len(series))
            for a, b in known:
                left = f.px(a) - slot / 2 + i * width
                top, base = f.py(max(b, 0)), f.py(min(b, 0))
                out.append(f'<rect class="{cls} bar" x="{left:.1f}" y="{top:.1f}" '
                           f'width="{max(width - 1, 1):.1f}" height="{max(base - top, 0.5):.1f}"/>')
    return out, skipped


def _histogram_svg(rows: list[dict[str, Any]], ys: list[str], bins: int,
                   fmt: str) -> tuple[list[str], int]:
    values = {y: [_value(r.get(y)) for r in rows] for y in ys}
    skipped = sum(v is None for vs in values.values() for v in vs)
    allv = [v for vs in values.values() for v in vs if v is not None]
    lo, hi = (min(allv), max(allv)) if allv else (0.0, 1.0)
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    width = (hi - lo) / bins
    counts = {y: [0] * bins for y in ys}
    for y, vs in values.items():
        for v in vs:
            if v is not None:
                counts[y][min(bins - 1, int((v - lo) / width))] += 1
    top = max([1, *(c for cs in counts.values() for c in cs)])
    yticks = _nice(0, top)
    f = _Frame(lo, hi, 0, max(yticks[-1], top))
    xlabels = [(f.px(lo + width * k), _short(lo + width * k, fmt))
               for k in range(0, bins + 1, max(1, bins // 5))]
    out = _axes(f, yticks, xlabels, "d")
    for i, y in enumerate(ys):
        for k, c in enumerate(counts[y]):
            if not c:
                continue
            left = f.px(lo + width * k) + i * (f.px(width) - f.px(0)) / len(ys)
            w = (f.px(width) - f.px(0)) / len(ys) - 1
            out.append(f'<rect class="series s{i} bar" x="{left:.1f}" y="{f.py(c):.1f}" '
                       f'width="{max(w, 1):.1f}" height="{f.py(0) - f.py(c):.1f}"/>')
    return out, skipped


def _table(rows: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    def text(v: Any) -> str:
        return "" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)

    return {"columns": keys, "rows": [[text(r.get(k)) for k in keys] for r in rows]}


def chart(comp: dict[str, Any], ctx: RenderContext) -> dict[str, Any]:
    kind = comp.get("kind")
    if kind not in KINDS:
        what = ("parallel_coords is not drawn by this console" if kind == "parallel_coords"
                else f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        return malformed("chart", what)
    summary = comp.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        return malformed("chart", "summary is required: the chart's text alternative")
    x, ys = comp.get("x"), comp.get("y")
    if isinstance(ys, str):
        ys = [ys]
    if kind != "histogram" and not isinstance(x, str):
        return malformed("chart", "x must name a field")
    if (not isinstance(ys, list) or not 1 <= len(ys) <= MAX_SERIES
            or not all(isinstance(y, str) for y in ys)):
        return malformed("chart", f"y must list 1 to {MAX_SERIES} fields")
    labels = comp.get("labels")
    if not (isinstance(labels, list) and len(labels) == len(ys)
            and all(isinstance(s, str) for s in labels)):
        labels = list(ys)
    bins = comp.get("bins", 10)
    if isinstance(bins, bool) or not isinstance(bins, int) or not 2 <= bins <= 50:
        return malformed("chart", f"bins must be a whole number from 2 to 50, got {bins!r}")
    fmt = string_prop(comp, "format") or string_prop(comp, "axis")
    cid = ctx.next_cid()
    view: dict[str, Any] = {"kind": "chart", "cid": cid, "chart": kind, "summary": summary[:3000],
                            "svg": Markup(""), "legend": [], "table": None, "note": "",
                            "unavailable": False, "reason": ""}
    try:
        rows = rows_of(comp.get("source"), ctx)
    except SourceFailed as e:
        return view | {"unavailable": True, "reason": str(e)}
    if kind == "histogram":
        parts, skipped = _histogram_svg(rows, ys, bins, fmt)
        what = f"histogram of {', '.join(labels)} in {bins} bins, {len(rows)} rows"
    else:
        assert isinstance(x, str)
        parts, skipped = _points_svg(rows, x, ys, kind, fmt)
        what = f"{kind} chart of {', '.join(labels)} by {x}, {len(rows)} rows"
    tid, did = f"{cid}-title", f"{cid}-desc"
    svg = (f'<svg class="chart-svg" role="img" aria-labelledby="{tid} {did}" '
           f'viewBox="0 0 {W} {H}" width="{W}" height="{H}" xmlns="http://www.w3.org/2000/svg">'
           f'<title id="{tid}">{escape(summary[:3000])}</title><desc id="{did}">{escape(what)}'
           f'</desc>{"".join(parts)}</svg>')
    view["svg"] = Markup(svg)  # noqa: S704 - every text in it went through escape()
    view["legend"] = [{"label": lab, "series": f"s{i}"} for i, lab in enumerate(labels)]
    view["table"] = _table(rows, ([x] if isinstance(x, str) else []) + list(ys))
    if not rows:
        view["note"] = "no rows"
    elif skipped:
        view["note"] = f"{skipped} value(s) not numbers, not drawn"
    return view
