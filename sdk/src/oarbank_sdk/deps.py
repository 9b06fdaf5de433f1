"""An author's module environment (contract section 4): ``oarbank-sdk deps compile`` and
``oarbank-sdk bundle wheels``.

``compile_requirements(module_dir, requirements_in)`` resolves ``requirements.in`` (what the
author asks for, any pip syntax) once per platform the module lists in ``requires.platforms``
(this machine's when it lists none), wheels only, and writes the ``requirements.txt`` beside it:
every distribution ``name==version --hash=sha256:<hex>`` with the hash of each platform's wheel,
no option, no marker. Platforms that resolve a distribution to different versions, or need it
on some platforms only, fail naming the distributions and the platforms. The host's SDK and its
closure are never pinned (the node's own). ``uv pip compile`` does the resolving where ``uv`` is
on PATH; otherwise ``pip download`` (into a scratch folder, deleted).

``bundle_wheels(module_dir)`` downloads, for every ``requirements.txt`` the module's ``exec``
uses and every platform, the pinned wheels into ``<module>/wheels`` (``--require-hashes``) and
returns what ``check`` would still say of them.

Both use pip's own configuration (its index): no host is named here.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from . import manifest as _manifest
from .manifest import requirements as reqs

__all__ = ["DepsError", "compile_requirements", "bundle_wheels", "pip_platform_args",
           "host_closure"]

# platform token -> pip's --platform tags (pip also accepts older compatible ones of each)
_PIP_PLATFORMS = {
    "linux-amd64": ("manylinux_2_28_x86_64", "manylinux2014_x86_64", "linux_x86_64"),
    "linux-arm64": ("manylinux_2_28_aarch64", "manylinux2014_aarch64", "linux_aarch64"),
    "darwin-arm64": ("macosx_14_0_arm64", "macosx_11_0_arm64"),
    "darwin-amd64": ("macosx_14_0_x86_64", "macosx_10_9_x86_64"),
    "windows-amd64": ("win_amd64",),
}
# platform token -> uv's --python-platform
_UV_PLATFORMS = {"linux-amd64": "x86_64-manylinux_2_28", "linux-arm64": "aarch64-manylinux_2_28",
                 "darwin-arm64": "aarch64-apple-darwin", "darwin-amd64": "x86_64-apple-darwin",
                 "windows-amd64": "x86_64-pc-windows-msvc"}
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


class DepsError(Exception):
    """Why the command cannot do it (one line or a few, for a person)."""


def host_closure(root: str = "oarbank-sdk") -> set[str]:
    """The normalized names of ``root`` and everything it requires, as installed here."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = reqs.normalize(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for r in requires:
            if "extra ==" in r:
                continue
            m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r)
            if m:
                todo.append(m.group(0))
    return seen


def pip_platform_args(token: str) -> list[str]:
    """pip's arguments that pick ``token``'s wheels for this Python version (none: this
    machine)."""
    if token == _manifest.platform_token():
        return []
    tags = _PIP_PLATFORMS.get(token)
    if tags is None:
        raise DepsError(f"platform {token!r}: no pip platform tags known for it")
    out = []
    for t in tags:
        out += ["--platform", t]
    v = f"{sys.version_info.major}{sys.version_info.minor}"
    return out + ["--python-version", v, "--implementation", "cp", "--abi", f"cp{v}",
                  "--abi", "abi3", "--abi", "none"]


def _platforms(module_dir: Path) -> list[str]:
    m = _manifest.load(module_dir, requirements=False)
    listed = (m.raw.get("requires") or {}).get("platforms") or []
    return [str(t) for t in listed] or [_manifest.platform_token()]


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise DepsError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def _resolve_pip(req_in: Path, token: str, scratch: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, [sha256 of the wheel]) of one platform's resolution (pip download)."""
    dest = scratch / token
    dest.mkdir()
    _run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
          "--only-binary", ":all:", "-d", str(dest), *pip_platform_args(token),
          "-r", str(req_in)], f"pip download for {token}")
    out: dict[str, tuple[str, list[str]]] = {}
    for f in sorted(dest.iterdir()):
        if not f.name.endswith(".whl"):
            raise DepsError(f"{token}: {f.name} is not a wheel (source distributions are refused)")
        parts = f.name[:-4].split("-")
        name = reqs.normalize(parts[0])
        version, hashes = out.get(name, (parts[1], []))
        out[name] = (version, [*hashes, reqs.sha256_file(f)])
    return out


def _resolve_uv(uv: str, req_in: Path, token: str) -> dict[str, tuple[str, list[str]]]:
    """The same with ``uv pip compile --generate-hashes`` for ``token``."""
    text = _run([uv, "pip", "compile", "--quiet", "--generate-hashes", "--no-header",
                 "--no-annotate", "--only-binary", ":all:", "--python-platform",
                 _UV_PLATFORMS.get(token, token), "--python-version",
                 f"{sys.version_info.major}.{sys.version_info.minor}", str(req_in)],
                f"uv pip compile for {token}")
    out: dict[str, tuple[str, list[str]]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        m = _PIN.match(line.strip())
        if m:
            hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", line)
            out[reqs.normalize(m.group(1))] = (m.group(2).split(";")[0], hashes)
    return out


def compile_requirements(module_dir: Path, req_in: Path, *, use_uv: bool | None = None,
                         platforms: Sequence[str] | None = None) -> Path:
    """Write the ``requirements.txt`` beside ``req_in``; returns its path. Raises
    ``DepsError``."""
    tokens = list(platforms) if platforms else _platforms(module_dir)
    uv = shutil.which("uv") if use_uv is not False else None
    if use_uv and uv is None:
        raise DepsError("uv is not on PATH")
    host = host_closure()
    per: dict[str, dict[str, tuple[str, list[str]]]] = {}
    with tempfile.TemporaryDirectory(prefix="oarbank-deps-") as scratch:
        for token in tokens:
            got = _resolve_uv(uv, req_in, token) if uv else _resolve_pip(req_in, token,
                                                                         Path(scratch))
            per[token] = {n: v for n, v in got.items() if n not in host}
    names = sorted({n for got in per.values() for n in got})
    problems = []
    lines = []
    for name in names:
        versions = {t: got[name][0] for t, got in per.items() if name in got}
        missing = [t for t in tokens if t not in versions]
        if missing:
            problems.append(f"{name}: needed on {', '.join(sorted(versions))} only, not on "
                            f"{', '.join(missing)} (no markers: pin it in {req_in.name} for "
                            "every platform or list fewer platforms)")
            continue
        if len(set(versions.values())) > 1:
            problems.append(f"{name}: the platforms resolve different versions ("
                            + ", ".join(f"{t}: {v}" for t, v in sorted(versions.items()))
                            + f"): pin one in {req_in.name}")
            continue
        hashes = sorted({h for got in per.values() for h in got[name][1]})
        lines.append(f"{name}=={next(iter(versions.values()))} "
                     + " ".join(f"--hash=sha256:{h}" for h in hashes))
    if problems:
        raise DepsError("cannot pin one set for every platform:\n" + "\n".join(problems))
    out = req_in.parent / reqs.FILE
    header = (f"# generated by `oarbank-sdk deps compile` from {req_in.name} for "
              f"{', '.join(tokens)}; do not edit by hand\n")
    out.write_text(header + "".join(line + "\n" for line in lines), encoding="utf-8")
    return out


def _module_requirements(module_dir: Path) -> list[Path]:
    m = _manifest.load(module_dir, requirements=False)
    execs = ([m.runner.exec] if m.runner is not None else []) + [s.exec for s in m.services]
    found = [reqs.requirements_for(a, m.bundle) for a in execs]
    return sorted({p for p in found if p is not None})


def bundle_wheels(module_dir: Path, *, platforms: Sequence[str] | None = None) -> list[str]:
    """Download every pinned wheel for every platform into ``<module>/wheels``; returns the
    problems ``check`` still finds (empty: covered). Raises ``DepsError``."""
    files = _module_requirements(module_dir)
    if not files:
        raise DepsError(f"{module_dir}: no requirements.txt beside any script its exec runs")
    tokens = list(platforms) if platforms else _platforms(module_dir)
    wheels = Path(module_dir) / reqs.WHEELS
    wheels.mkdir(exist_ok=True)
    for req in files:
        for token in tokens:
            _run([sys.executable, "-m", "pip", "download", "--disable-pip-version-check",
                  "--no-deps", "--only-binary", ":all:", "--require-hashes", "-d", str(wheels),
                  *pip_platform_args(token), "-r", str(req)], f"pip download for {token}")
    bundle = Path(module_dir).resolve()
    return [p for req in files for p in reqs.wheel_problems(req, bundle)]
