"""macOS seam: the Seatbelt (``sandbox-exec -p PROFILE``) profile and command line.

The profile comes from the one template ``seatbelt.sb`` next to this file. Pure functions:
nothing here runs on Linux beyond the unit tests of the generated text, and the Linux path
never imports this module. Untested against a real macOS kernel here (the CI VM matrix is a
later issue).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["SANDBOX_EXEC", "TEMPLATE", "profile", "command"]

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
TEMPLATE = Path(__file__).with_name("seatbelt.sb")
_PLACEHOLDER = "@WRITABLE@"


def _quote(path: str) -> str:
    """A Seatbelt (TinyScheme) string literal."""
    if "\x00" in path or "\n" in path:
        raise ValueError(f"path {path!r} cannot appear in a Seatbelt profile")
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def profile(writable: list[str] | tuple[str, ...] = (), template: str | None = None) -> str:
    """The profile text with ``writable`` (absolute folders) allowed for writing."""
    text = TEMPLATE.read_text() if template is None else template
    if text.count(_PLACEHOLDER) != 1:
        raise ValueError(f"Seatbelt template must contain {_PLACEHOLDER} exactly once")
    for path in writable:
        if not path.startswith("/"):
            raise ValueError(f"writable folder {path!r} must be an absolute path")
    # (allow file-write*) with no filter would allow writing everywhere: with nothing
    # writable, point it at a path that cannot exist instead.
    filters = " ".join(f"(subpath {_quote(p)})" for p in writable) or '(literal "/nonexistent/oarbank")'
    return text.replace(_PLACEHOLDER, filters)


def command(argv: list[str] | tuple[str, ...], writable: list[str] | tuple[str, ...] = ()) -> list[str]:
    """``sandbox-exec -p PROFILE ARGV...``."""
    return [SANDBOX_EXEC, "-p", profile(writable), *argv]
