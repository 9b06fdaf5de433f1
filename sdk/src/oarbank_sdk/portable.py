"""Platform tokens and portable paths, by upstream's names (``oarbank_sdk.portable``).
Standard library only: runners import it (through ``oarbank_sdk.platform``) or copy it.

- A platform token is ``<os>-<arch>`` (``linux-amd64``); a well-formed token nobody runs is
  still valid. A per-platform table key is a token or an OS alone (``linux``).
- A portable path is relative, ``/``-separated ASCII that every supported file system stores
  the same way: no ``.``/``..`` or empty segment, no Windows device name, no trailing dot or
  space, at most ``MAX_PATH_BYTES`` bytes and ``MAX_SEGMENT`` characters a segment.
"""

from __future__ import annotations

import os
import re
import sys
import unicodedata
from collections.abc import Iterable
from pathlib import Path

__all__ = ["ARCHES", "KNOWN_PLATFORMS", "MAX_PATH_BYTES", "MAX_SEGMENT", "OSES", "PLATFORM_KEY",
           "PLATFORM_TOKEN", "RESERVED", "SEGMENT", "PathError", "casefold_collisions",
           "check_portable_path", "host_platform", "is_platform_token", "is_portable_path",
           "oci_platform", "os_env", "split_platform"]

OSES = ("darwin", "linux", "windows")
ARCHES = ("arm64", "amd64")
KNOWN_PLATFORMS = tuple(f"{o}-{a}" for o in OSES for a in ARCHES)
PLATFORM_TOKEN = re.compile(r"[a-z][a-z0-9]*-[a-z0-9_]+")
PLATFORM_KEY = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9_]+)?")

_MACHINE_ARCH = {"x86_64": "amd64", "amd64": "amd64", "x64": "amd64",
                 "aarch64": "arm64", "arm64": "arm64"}


def is_platform_token(s: object) -> bool:
    """Whether ``s`` is written as ``<os>-<arch>``."""
    return isinstance(s, str) and PLATFORM_TOKEN.fullmatch(s) is not None


def split_platform(token: str) -> tuple[str, str]:
    """``"linux-amd64"`` -> ``("linux", "amd64")``; an OS alone -> ``(os, "")``."""
    os_name, _, arch = token.partition("-")
    return os_name, arch


def _windows_native_machine() -> str | None:
    """The machine's own architecture on Windows, also under an emulated interpreter."""
    try:
        import ctypes
        from ctypes import wintypes

        fn = getattr(ctypes.WinDLL("kernel32"), "IsWow64Process2", None)  # type: ignore[attr-defined]
        if fn is None:
            return None
        process, native = wintypes.USHORT(), wintypes.USHORT()
        if not fn(wintypes.HANDLE(-1), ctypes.byref(process), ctypes.byref(native)):
            return None
    except (OSError, AttributeError):
        return None
    return {0xAA64: "arm64", 0x8664: "amd64"}.get(native.value)


def host_platform() -> str:
    """This machine's token (the machine's architecture, not the interpreter's build)."""
    import platform as _stdlib_platform

    if sys.platform == "win32":
        os_name = "windows"
    elif sys.platform.startswith("linux"):
        os_name = "linux"
    else:
        os_name = sys.platform  # darwin, freebsd, ...
    machine = (_windows_native_machine() if os_name == "windows" else None) or \
        _stdlib_platform.machine().lower()
    return f"{os_name}-{_MACHINE_ARCH.get(machine, machine)}"


def os_env(home: str | os.PathLike[str], tmp: str | os.PathLike[str],
           locale: str = "C.UTF-8") -> dict[str, str]:
    """The conventional variables a module process gets on this OS: a search path, ``home``,
    ``tmp``, UTF-8 (and on Windows the system variables a program needs to start at all)."""
    if os.name == "nt":
        root = os.environ.get("SYSTEMROOT", r"C:\Windows")  # Windows: names in any case
        home_s = str(home)
        return {
            "SystemRoot": root, "windir": root,
            "SystemDrive": os.environ.get("SYSTEMDRIVE", root[:2]),
            "ComSpec": rf"{root}\System32\cmd.exe", "PATHEXT": ".COM;.EXE",
            "PATH": rf"{root}\System32;{root};{root}\System32\Wbem",
            "USERPROFILE": home_s, "TEMP": str(tmp), "TMP": str(tmp),
            "APPDATA": os.path.join(home_s, "AppData", "Roaming"),
            "LOCALAPPDATA": os.environ.get("LOCALAPPDATA")
            or os.path.join(home_s, "AppData", "Local"),
            "PROCESSOR_ARCHITECTURE": os.environ.get("PROCESSOR_ARCHITECTURE", "AMD64"),
            "NUMBER_OF_PROCESSORS": os.environ.get("NUMBER_OF_PROCESSORS", "1"),
            "PYTHONUTF8": "1",
        }
    return {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(home), "TMPDIR": str(tmp),
            "LANG": locale, "LC_ALL": locale, "PYTHONUTF8": "1"}


def oci_platform(token: str) -> str:
    """A token in a container image's spelling: ``linux-arm64`` -> ``linux/arm64``."""
    os_name, arch = split_platform(token)
    return f"{os_name}/{arch}"


# --- portable paths ------------------------------------------------------------------------------

MAX_PATH_BYTES = 200
MAX_SEGMENT = 100
SEGMENT = re.compile(r"[A-Za-z0-9_+@-][A-Za-z0-9._+@-]*")
RESERVED = frozenset({"CON", "PRN", "AUX", "NUL", "CONIN$", "CONOUT$"}
                     | {f"{dev}{n}" for dev in ("COM", "LPT")
                        for n in (*"0123456789", "\u00b9", "\u00b2", "\u00b3")})


class PathError(ValueError):
    """A path that is not portable; the message says which rule it breaks."""


def check_portable_path(path: str, allow_dotfiles: bool = False) -> str:
    """``path`` if it is portable, else ``PathError`` naming the rule. ``allow_dotfiles``
    lets a segment start with one dot (``.config``)."""
    if not isinstance(path, str) or not path:
        raise PathError("the path is empty")
    if unicodedata.normalize("NFC", path) != path:
        raise PathError(f"{path!r} is not in Unicode NFC form")
    if not path.isascii():
        raise PathError(f"{path!r} has a non-ASCII character")
    if len(path.encode("ascii")) > MAX_PATH_BYTES:
        raise PathError(f"{path!r} is longer than {MAX_PATH_BYTES} bytes")
    if path.startswith("/") or "\\" in path or ":" in path:
        raise PathError(f"{path!r} must be relative and '/'-separated (no '\\', ':' or drive)")
    for seg in path.split("/"):
        if seg in ("", ".", ".."):
            raise PathError(f"{path!r} has an empty, '.' or '..' segment")
        if len(seg) > MAX_SEGMENT:
            raise PathError(f"{path!r}: segment {seg[:20]!r}... is over {MAX_SEGMENT} characters")
        body = seg[1:] if allow_dotfiles and len(seg) > 1 and seg.startswith(".") else seg
        if SEGMENT.fullmatch(body) is None:
            raise PathError(f"{path!r}: segment {seg!r} has a character that is not portable")
        if seg[-1] in ". ":
            raise PathError(f"{path!r}: segment {seg!r} ends with a dot or a space")
        if seg.split(".", 1)[0].upper() in RESERVED:
            raise PathError(f"{path!r}: {seg!r} is a device name on Windows")
    return path


def is_portable_path(path: str, allow_dotfiles: bool = False) -> bool:
    try:
        check_portable_path(path, allow_dotfiles)
    except PathError:
        return False
    return True


def casefold_collisions(paths: Iterable[str | Path]) -> list[tuple[str, str]]:
    """Pairs of distinct paths that name one file where case is not told apart (first seen,
    then the one that collides with it)."""
    first: dict[str, str] = {}
    pairs = []
    for p in paths:
        text = str(p)
        key = text.casefold()
        if key in first and first[key] != text:
            pairs.append((first[key], text))
        first.setdefault(key, text)
    return pairs
