"""Version ranges as manifests write them: ``">=2.5,<3"``, ``"~=1.2"``, ``"==2.*"``.

Only what the checker needs: is the range well formed, and what is its lower bound.
"""

from __future__ import annotations

import re

__all__ = ["RangeError", "allows", "at_least", "lower_bound", "parse_range", "parse_version"]

_CLAUSE = re.compile(r"^\s*(>=|<=|==|!=|~=|>|<)?\s*(\d+(?:\.\d+)*)(\.\*)?\s*$")


class RangeError(ValueError):
    pass


def parse_version(text: str) -> tuple[int, ...]:
    if not re.fullmatch(r"\d+(?:\.\d+)*", text.strip()):
        raise RangeError(f'"{text}" is not a version like 2.5')
    return tuple(int(p) for p in text.strip().split("."))


def parse_range(text: str) -> list[tuple[str, tuple[int, ...], bool]]:
    """Clauses ``(operator, version, wildcard)``; a bare version means ``==``."""
    clauses = []
    if not text.strip():
        raise RangeError("empty version range")
    for raw in text.split(","):
        m = _CLAUSE.match(raw)
        if not m:
            raise RangeError(
                f'"{raw.strip()}" is not a version clause (write e.g. ">=2.5,<3")'
            )
        op, ver, star = m.group(1) or "==", m.group(2), bool(m.group(3))
        if star and op not in ("==", "!="):
            raise RangeError(f'"{raw.strip()}": a ".*" version only goes with == or !=')
        clauses.append((op, tuple(int(p) for p in ver.split(".")), star))
    return clauses


def _pad(v: tuple[int, ...], n: int = 4) -> tuple[int, ...]:
    return v + (0,) * (n - len(v))


def lower_bound(text: str) -> tuple[tuple[int, ...], bool] | None:
    """The highest lower bound of a range as ``(version, inclusive)``; None when unbounded below.

    ``>=2.5`` -> ((2, 5), True); ``>2.5`` -> ((2, 5), False); ``==2.*`` -> ((2,), True);
    ``~=2.5`` -> ((2, 5), True).
    """
    best: tuple[tuple[int, ...], bool] | None = None
    for op, ver, _star in parse_range(text):
        if op in (">=", "==", "~="):
            cand = (ver, True)
        elif op == ">":
            cand = (ver, False)
        else:
            continue
        if best is None or _pad(cand[0]) > _pad(best[0]) or (
            _pad(cand[0]) == _pad(best[0]) and not cand[1]
        ):
            best = cand
    return best


def at_least(text: str, minimum: tuple[int, ...]) -> bool:
    """Does every version the range allows satisfy ``>= minimum``?"""
    bound = lower_bound(text)
    if bound is None:
        return False
    # ">2.4" still allows 2.4.1, below 2.5: exclusive or not, the bound itself must be >= minimum.
    return _pad(bound[0]) >= _pad(minimum)


def allows(text: str, version: str | tuple[int, ...]) -> bool:
    """Does the range ``text`` allow ``version``? ``>=2.5,<3`` allows 2.5 and 2.9.1, not 3.0;
    ``==2.*`` allows every 2.x; ``~=2.5`` is ``>=2.5,<3``. Raises ``RangeError`` on a bad range."""
    v = _pad(parse_version(version) if isinstance(version, str) else version)
    for op, ver, star in parse_range(text):
        b = _pad(ver)
        if star:  # ==2.* / !=2.*: compare the leading parts only
            same = v[:len(ver)] == ver
            ok = same if op == "==" else not same
        elif op == "~=":  # compatible release: >= ver and the same prefix but the last part
            ok = v >= b and v[:max(1, len(ver) - 1)] == ver[:max(1, len(ver) - 1)]
        else:
            ok = {">=": v >= b, "<=": v <= b, ">": v > b, "<": v < b, "==": v == b,
                  "!=": v != b}[op]
        if not ok:
            return False
    return True
