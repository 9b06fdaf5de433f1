"""macOS seam: the Seatbelt (``sandbox-exec -p PROFILE``) profile and command line.

The profile comes from the one template ``seatbelt.sb`` next to this file, filled with the
launcher's walls as the Linux launcher applies them: the writable folders are exactly the
``--write`` grants (a runner's workdir, a service's data dir), the readable ones the system's
folders (``SYSTEM_READ``), the interpreter's and the ``--read`` grants, the device nodes
``_policy.SYSTEM_DEVICES`` and the ``--dev`` grants. Pure functions; the Linux path never
imports this module.

What is tested where: ``sdk/tests/test_seatbelt_profile.py`` (on every system) generates the
profile for a runner's and a service's walls and parses it: deny by default, no network allow
and every network operation denied, the writable paths exactly the contract's, reads limited
to the Linux launcher's set. What only a Mac can show, and no test here has shown yet: that
``sandbox-exec`` compiles the profile, that Python starts under it (the system folders are
enough), and that the kernel holds the denials. The macOS workflow's agent tests and local
scenarios run every child under it where the SDK's probe finds it confines (``macos_seatbelt``
enforced); where it does not, they run unconfined and the agent says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ._policy import SYSTEM_DEVICES

__all__ = ["SANDBOX_EXEC", "TEMPLATE", "SYSTEM_READ", "profile", "command"]

SANDBOX_EXEC = "/usr/bin/sandbox-exec"
TEMPLATE = Path(__file__).with_name("seatbelt.sb")
_WRITABLE = "@WRITABLE@"
_READABLE = "@READABLE@"
_DEVICES = "@DEVICES@"
# The macOS counterpart of ``_policy.SYSTEM_READ``: the system's programs and libraries (the
# dyld shared cache lives under /System and /private/var/db/dyld), Homebrew's and python.org's
# installations, and the few files of /etc (/private/etc) a C library reads.
SYSTEM_READ = (
    "/System", "/usr", "/bin", "/sbin", "/Library/Frameworks",
    "/Library/Developer/CommandLineTools", "/opt/homebrew", "/private/var/db/dyld",
    "/private/var/db/timezone", "/private/etc/localtime", "/private/etc/passwd",
    "/private/etc/group", "/private/etc/hosts", "/private/etc/protocols",
    "/private/etc/services", "/private/etc/ssl",
)
_NOTHING = '(literal "/nonexistent/oarbank")'


def _quote(path: str) -> str:
    """A Seatbelt (TinyScheme) string literal."""
    if "\x00" in path or "\n" in path:
        raise ValueError(f"path {path!r} cannot appear in a Seatbelt profile")
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _filters(kind: str, paths: Iterable[str]) -> str:
    paths = list(dict.fromkeys(paths))
    for path in paths:
        if not path.startswith("/"):
            raise ValueError(f"sandbox path {path!r} must be an absolute path")
    # (allow file-write*) with no filter would allow writing everywhere: with nothing
    # given, point it at a path that cannot exist instead.
    return " ".join(f"({kind} {_quote(p)})" for p in paths) or _NOTHING


def profile(writable: Iterable[str] = (), template: str | None = None, *,
            readable: Iterable[str] = (), devices: Iterable[str] = ()) -> str:
    """The profile text: ``writable`` (absolute folders) allowed for writing and reading,
    ``SYSTEM_READ`` and ``readable`` for reading and exec, ``_policy.SYSTEM_DEVICES`` and
    ``devices`` for reading and writing. Raises ValueError on a relative or unquotable path
    and on a template without each placeholder exactly once."""
    text = TEMPLATE.read_text() if template is None else template
    for mark in (_WRITABLE, _READABLE, _DEVICES):
        if text.count(mark) != (2 if mark == _READABLE else 1):
            raise ValueError(f"Seatbelt template must contain {mark} exactly "
                             f"{'twice' if mark == _READABLE else 'once'}")
    writable = list(writable)
    return (text.replace(_WRITABLE, _filters("subpath", writable))
            .replace(_READABLE, _filters("subpath", [*SYSTEM_READ, *readable, *writable]))
            .replace(_DEVICES, _filters("literal", [*SYSTEM_DEVICES, *devices])))


def command(argv: list[str] | tuple[str, ...], writable: Iterable[str] = (), *,
            readable: Iterable[str] = (), devices: Iterable[str] = ()) -> list[str]:
    """``sandbox-exec -p PROFILE ARGV...``."""
    return [SANDBOX_EXEC, "-p", profile(writable, readable=readable, devices=devices), *argv]
