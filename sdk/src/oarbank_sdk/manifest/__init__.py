"""Load and check a module's ``oarbank-module.toml`` (contract section 1).

``load(path)`` returns a ``Manifest`` or raises ``ManifestError`` listing every problem, each
with a key path (``services[0].endpoint``) and a message a person can act on.
``check(path)`` returns the same without raising. ``expand_exec`` turns a manifest argv into
one to run: ``python`` -> the interpreter, ``{bundle}`` -> the bundle's absolute path.
``platform_token()`` is this machine's ``<os>-<arch>`` token in the ``platforms`` spelling.
"""

from __future__ import annotations

import platform
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from . import requirements as _requirements
from .checker import GPU_APIS, PLATFORMS, SERVICE_NAME
from .checker import build as _build
from .model import (
    LIFECYCLES,
    MANIFEST_FILE,
    Gpu,
    Manifest,
    ManifestError,
    Note,
    Problem,
    Restart,
    Runner,
    Service,
    Stage,
    UiEntry,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "GPU_APIS",
    "LIFECYCLES",
    "MANIFEST_FILE",
    "PLATFORMS",
    "SERVICE_NAME",
    "Gpu",
    "Manifest",
    "ManifestError",
    "Note",
    "Problem",
    "Restart",
    "Runner",
    "Service",
    "Stage",
    "UiEntry",
    "check",
    "expand_exec",
    "load",
    "manifest_path",
    "platform_token",
]

_AT = re.compile(r"\(at line (\d+), column (\d+)\)\s*$")


def manifest_path(path: str | Path) -> Path:
    """The toml file for ``path``: the path itself, or ``<dir>/oarbank-module.toml``."""
    p = Path(path)
    return p / MANIFEST_FILE if p.is_dir() else p


def check(path: str | Path, *, requirements: bool = True,
          ) -> tuple[Manifest | None, list[Problem]]:
    """``(manifest, [])`` when valid, else ``(None, problems)``; never raises for bad input.
    ``requirements``: also each module environment's ``requirements.txt`` and the wheels
    that must cover it (``requirements.py``); False: the manifest alone (``deps``, which makes
    them)."""
    toml = manifest_path(path)
    try:
        data = toml.read_bytes()
    except FileNotFoundError:
        where = Path(path)
        if where.is_dir():
            return None, [Problem(MANIFEST_FILE, f"no {MANIFEST_FILE} in {where}")]
        return None, [Problem(MANIFEST_FILE, f"{where} does not exist")]
    except OSError as e:
        return None, [Problem(MANIFEST_FILE, f"cannot read {toml}: {e.strerror or e}")]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, [Problem("toml", f"not UTF-8 text (byte {e.start}): TOML files are UTF-8")]
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return None, [_syntax_problem(str(e))]
    bundle = toml.resolve().parent
    manifest, problems = _build(doc, toml, bundle)
    if manifest is not None and requirements:
        problems = _requirements_problems(manifest)
        if problems:
            return None, problems
    return manifest, problems


def _requirements_problems(m: Manifest) -> list[Problem]:
    """Each ``requirements.txt`` an ``exec`` uses (``requirements.py``): its lines, its wheels."""
    execs = ([("runner.exec", m.runner.exec)] if m.runner is not None else []) + [
        (f"services[{i}].exec", s.exec) for i, s in enumerate(m.services)]
    out: list[Problem] = []
    seen: set[Path] = set()
    for key, argv in execs:
        req = _requirements.requirements_for(argv, m.bundle)
        if req is None or req in seen:
            continue
        seen.add(req)
        out += [Problem(key, msg) for msg in _requirements.wheel_problems(req, m.bundle)]
    return out


def load(path: str | Path, *, requirements: bool = True) -> Manifest:
    """The module's manifest; raises ``ManifestError`` (every problem listed) when invalid."""
    manifest, problems = check(path, requirements=requirements)
    if manifest is None:
        raise ManifestError(manifest_path(path), problems)
    return manifest


def expand_exec(
    argv: Sequence[str], bundle: str | Path, python: str = sys.executable
) -> list[str]:
    """Element 0 ``python`` -> ``python`` (the interpreter); ``{bundle}`` anywhere -> the
    bundle's absolute path. Plain text replacement: other braces are left alone."""
    root = str(Path(bundle).resolve())
    out = [a.replace("{bundle}", root) for a in argv]
    if out and argv[0] == "python":
        out[0] = python
    return out


def platform_token() -> str:
    """This machine's ``<os>-<arch>`` as ``platforms`` spells it, e.g. ``linux-amd64`` (the
    agent's ``OARBANK_PLATFORM``)."""
    osname = {"linux": "linux", "darwin": "darwin", "win32": "windows"}.get(sys.platform, sys.platform)
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return f"{osname}-{arch}"


def _syntax_problem(message: str) -> Problem:
    m = _AT.search(message)
    if m:
        text = _AT.sub("", message).strip()
        return Problem("toml", f"syntax error at line {m.group(1)}, column {m.group(2)}: {text}")
    return Problem("toml", f"syntax error: {message}")
