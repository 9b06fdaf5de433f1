"""``markdown``: the contract's subset (paragraphs, emphasis, code, lists and typed internal
links) turned into safe HTML by markdown-it-py (see the README's "Markdown").

The parser is markdown-it's ``zero`` preset with only those rules enabled, and raw HTML off:
``<script>`` in a module's text is text. Every link is decided here, not by the parser:
``https://`` links go out (``rel="noopener noreferrer"``); a typed internal link
``job:12``, ``node:gpu-01``, ``page:overview``, ``dataset:..``, ``campaign:..``, ``tab:..``
goes where the portal has a page for it (the same resolver as ``link``); anything else
(``javascript:``, ``data:``, a relative path, a target with no page here) is its text,
with why on hover. Images are not in the subset: their syntax stays text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.token import Token
from markupsafe import Markup, escape

from oarbank_sdk.page_forms import TARGET_KINDS, Target

__all__ = ["MAX_TEXT", "render_markdown"]

MAX_TEXT = 3000
_RULES = ["emphasis", "backticks", "list", "fence", "code", "link", "newline", "escape"]
_INTERNAL = tuple(k for k in TARGET_KINDS if k != "url")


def _parser() -> MarkdownIt:
    md = MarkdownIt("zero", {"html": False, "linkify": False, "typographer": False})
    md.enable(_RULES)
    md.validateLink = lambda url: True  # type: ignore[method-assign]  # decided when drawn
    md.normalizeLink = lambda url: url  # type: ignore[method-assign]  # ...as written
    md.add_render_rule("link_open", _link_open)
    md.add_render_rule("link_close", _link_close)
    return md


def _decide(href: str, resolve: Callable[[Target], str | None] | None) -> tuple[str | None, str]:
    if href.lower().startswith("https://") and not any(c in href for c in "\"'<> \t\n"):
        return href, ""
    kind, sep, value = href.partition(":")
    if sep and kind in _INTERNAL and value:
        target = resolve(Target(kind, value)) if resolve is not None else None
        if target is not None:
            return target, ""
        return None, f"this portal has no page for {kind} {value}"
    return None, "not a link this portal follows (https:// or a typed target such as page:id)"


def _link_open(self: Any, tokens: Sequence[Token], idx: int, options: Any,
               env: dict[str, Any]) -> str:
    href = str(tokens[idx].attrGet("href") or "")
    target, why = _decide(href, env.get("resolve"))
    env.setdefault("stack", []).append(target is not None)
    if target is None:
        return f'<span class="unlinked" title="{escape(why)}">'
    external = ' rel="noopener noreferrer"' if target.startswith("https://") else ""
    return f'<a href="{escape(target)}"{external}>'


def _link_close(self: Any, tokens: Sequence[Token], idx: int, options: Any,
                env: dict[str, Any]) -> str:
    stack = env.get("stack") or [False]
    return "</a>" if stack.pop() else "</span>"


_MD = _parser()


def render_markdown(text: str, resolve: Callable[[Target], str | None] | None) -> Markup:
    """Safe HTML for ``text`` (at most ``MAX_TEXT`` characters: the rest is cut)."""
    return Markup(_MD.render(text[:MAX_TEXT], {"resolve": resolve}))  # noqa: S704 - escaped by markdown-it (html off) and _link_open
