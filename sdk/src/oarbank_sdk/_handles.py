"""A handle value's form and its error, shared by every transport (``_transport.py`` on POSIX,
``_winpipe.py`` on Windows), so that neither imports the other for them.

Standard library only: the service side of the SDK imports this.
"""

from __future__ import annotations

__all__ = ["UnsupportedHandle", "parse_scheme"]


class UnsupportedHandle(ValueError):
    """A handle value this platform cannot open (wrong scheme, not a number, not a socket)."""


def parse_scheme(scheme: str, value: str, what: str) -> int:
    """``<scheme>:<n>`` -> n. Raises ``UnsupportedHandle``."""
    prefix = scheme + ":"
    if not isinstance(value, str) or not value.startswith(prefix):
        raise UnsupportedHandle(f"handle {value!r} is not of the form '{prefix}<n>'")
    digits = value[len(prefix) :]
    if not digits.isdigit():
        raise UnsupportedHandle(f"handle {value!r}: '{digits}' is not a {what}")
    return int(digits)
