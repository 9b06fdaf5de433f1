"""``when``: a component's visibility, a small comparison grammar evaluated here (never in the
browser) over a fixed context: ``row.*``, ``job.*``, ``node.*``, ``user.role``, ``setting.*``.

    expr   := clause (("and" | "or") clause)*        ("and" binds tighter than "or")
    clause := "not" clause | "(" expr ")" | path [op literal]
    op     := == | != | < | <= | > | >= | in
    path   := (row | job | node | user | setting) "." name ("." name)*
    literal:= 'text' | "text" | number | true | false | null | self | [literal, ...]

A path with nothing to compare is true when its value is truthy. What this portal knows:
``node.id``, ``node.hostname`` and ``node.online`` on a node panel; ``user.role`` is
``viewer`` (pages have no signed-in users); ``job.*`` and ``setting.*`` are unset here (null),
so a component shown only for a job is hidden; ``self`` is the module's id. A malformed
expression raises ``WhenError`` naming where it went wrong (the component shows a
placeholder saying so: a typo must not hide a component silently).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["ROOTS", "WhenError", "evaluate"]

ROOTS = ("row", "job", "node", "user", "setting")
MAX_LEN = 200
_TOKEN = re.compile(r"\s*(?:(?P<str>'[^']*'|\"[^\"]*\")|(?P<num>-?\d+(?:\.\d+)?)"
                    r"|(?P<op>==|!=|<=|>=|<|>)|(?P<punct>[()\[\],])"
                    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*))")


class WhenError(ValueError):
    pass


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise WhenError(f"cannot read {text[pos:pos + 20]!r} at character {pos + 1}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str, ctx: dict[str, Any]) -> None:
        self.toks = _tokens(text)
        self.i = 0
        self.ctx = ctx

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise WhenError("the expression ends too early")
        self.i += 1
        return tok

    def expr(self) -> bool:
        value = self.conj()
        while self.peek() == ("word", "or"):
            self.take()
            right = self.conj()
            value = value or right
        return value

    def conj(self) -> bool:
        value = self.clause()
        while self.peek() == ("word", "and"):
            self.take()
            right = self.clause()
            value = value and right
        return value

    def clause(self) -> bool:
        tok = self.take()
        if tok == ("word", "not"):
            return not self.clause()
        if tok == ("punct", "("):
            value = self.expr()
            if self.peek() is None or self.take() != ("punct", ")"):
                raise WhenError("a '(' is not closed")
            return value
        if tok[0] != "word":
            raise WhenError(f"expected a path such as node.online, got {tok[1]!r}")
        left = self.path(tok[1])
        nxt = self.peek()
        if nxt is not None and (nxt[0] == "op" or nxt == ("word", "in")):
            op = self.take()[1]
            right = self.literal()
            return _compare(left, op, right)
        return bool(left)

    def path(self, word: str) -> Any:
        parts = word.split(".")
        if parts[0] not in ROOTS or len(parts) < 2:
            raise WhenError(f"{word!r}: a path starts with one of {', '.join(ROOTS)} "
                            "and names a field (node.online)")
        value: Any = self.ctx.get(parts[0]) or {}
        for p in parts[1:]:
            value = value.get(p) if isinstance(value, dict) else None
        return value

    def literal(self) -> Any:
        kind, text = self.take()
        if kind == "str":
            return text[1:-1]
        if kind == "num":
            return float(text) if "." in text else int(text)
        if (kind, text) == ("punct", "["):
            items = []
            while self.peek() != ("punct", "]"):
                items.append(self.literal())
                if self.peek() == ("punct", ","):
                    self.take()
            self.take()
            return items
        if kind == "word" and text in ("true", "false", "null", "self"):
            return {"true": True, "false": False, "null": None}.get(text, self.ctx.get("self"))
        raise WhenError(f"expected a value ('text', a number, true, false, null, self), "
                        f"got {text!r}")


def _compare(left: Any, op: str, right: Any) -> bool:
    if op == "==":
        return bool(left == right)
    if op == "!=":
        return bool(left != right)
    if op == "in":
        return isinstance(right, list) and left in right
    try:
        return bool({"<": left < right, "<=": left <= right, ">": left > right,
                     ">=": left >= right}[op])
    except TypeError:  # null or unlike kinds: not comparable, so not shown
        return False


def evaluate(text: Any, ctx: dict[str, Any]) -> bool:
    """Whether a component with ``when = text`` shows; WhenError when ``text`` is malformed."""
    if not isinstance(text, str) or not text.strip():
        raise WhenError("expected a non-empty expression such as \"node.online == true\"")
    if len(text) > MAX_LEN:
        raise WhenError(f"longer than {MAX_LEN} characters")
    p = _Parser(text, ctx)
    value = p.expr()
    if p.peek() is not None:
        raise WhenError(f"unexpected {p.peek()[1]!r} after a complete expression")  # type: ignore[index]
    return value
