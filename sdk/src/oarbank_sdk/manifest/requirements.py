"""A module environment's pins (contract section 4): the ``requirements.txt`` beside a script.

Every line is ``name==version --hash=sha256:<64 hex>`` (more ``--hash`` options for more
platforms' wheels; a trailing ``\\`` continues a line; ``#`` starts a comment): no other option,
no marker, no URL, no range. ``wheels/`` in the bundle holds a wheel for every pin, whose sha256
is one of its hashes; a source distribution there is refused (building one runs its code).

``requirements_for(argv, bundle)`` is the file an ``exec`` argv uses (None: the host's
interpreter); ``parse`` reads one (``RequirementsError`` names the line); ``problems`` is what
``check`` adds for a manifest; ``wheels_for`` the bundle's wheels that serve a file's pins.

How a node (the agent, and ``conform`` as the agent would) installs one, offline, each step a
child inside the sandbox that reads the bundle and writes only the new environment:
``venv_argv`` (``--system-site-packages`` only where the host's interpreter sees the base
installation's), ``pip_argv`` with ``install_env`` (no pip configuration, no cache, no index;
pip sees the environment and the host's pip, no more), and then ``host_pth`` written into it
(the environment sees the host's site folders).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FILE", "WHEELS", "Pin", "RequirementsError", "requirements_for", "parse",
           "wheels_for", "wheel_problems", "normalize", "sha256_file", "script_of",
           "HOST_PTH", "venv_argv", "host_pth", "pip_argv", "pip_folder", "install_env",
           "env_python", "env_purelib", "host_site_dirs", "sees_system_site", "host_identity"]

FILE = "requirements.txt"
WHEELS = "wheels"
_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+!_-]*$")
_HASH = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
_SOURCE_SUFFIXES = (".tar.gz", ".zip", ".tar.bz2", ".tar.xz", ".tgz", ".tar")


class RequirementsError(ValueError):
    """A requirements file that breaks the rules; ``str``: ``<file> line N: why``."""


@dataclass(frozen=True)
class Pin:
    name: str  # normalized (PEP 503)
    version: str
    hashes: tuple[str, ...]
    line: int


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def script_of(argv: Sequence[str], bundle: str | Path) -> Path | None:
    """The script of ``python [options] SCRIPT ...`` (``{bundle}`` expanded), or None (another
    program, ``-m``, ``-c``)."""
    if not argv or argv[0] != "python":
        return None
    root = str(Path(bundle).resolve())
    for arg in argv[1:]:
        if arg in ("-m", "-c", "-"):
            return None
        if arg.startswith("-"):
            continue
        p = Path(arg.replace("{bundle}", root))
        return p if p.is_absolute() else Path(root) / p
    return None


def requirements_for(argv: Sequence[str], bundle: str | Path) -> Path | None:
    """The ``requirements.txt`` beside the argv's script, when there is one in the bundle."""
    script = script_of(argv, bundle)
    if script is None:
        return None
    req = script.parent / FILE
    root = Path(bundle).resolve()
    try:
        req.resolve().relative_to(root)
    except ValueError:
        return None
    return req if req.is_file() else None


def parse(path: Path) -> list[Pin]:
    """The file's pins; raises ``RequirementsError`` naming the first line that breaks a rule
    (and ``OSError`` when it cannot be read)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    pins: list[Pin] = []
    seen: dict[str, int] = {}
    logical: list[tuple[int, str]] = []
    buf, start = "", 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if not buf:
            start = n
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        if buf.strip():
            logical.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        logical.append((start, buf.strip()))
    for n, line in logical:
        def bad(why: str, n: int = n, line: str = line) -> RequirementsError:
            return RequirementsError(f"{path} line {n}: {why}: {line[:120]!r}")

        if ";" in line:
            raise bad("a marker (';'): one file serves every platform, markers are not allowed")
        head, *opts = line.split()
        if head.startswith("-"):
            raise bad(f"an option ({head.split('=')[0]}): only 'name==version --hash=sha256:<hex>' "
                      "lines are allowed")
        name, sep, version = head.partition("==")
        if not sep or not _NAME.match(name.split("[")[0]) or not _VERSION.match(version):
            raise bad("expected 'name==version --hash=sha256:<64 hex>' (an exact pin)")
        if "[" in name:
            raise bad("extras are not allowed: pin every distribution itself")
        hashes = []
        for opt in opts:
            m = _HASH.match(opt)
            if m is None:
                raise bad(f"{opt.split('=')[0]!r}: the only option allowed is "
                          "--hash=sha256:<64 lowercase hex>")
            hashes.append(m.group(1))
        if not hashes:
            raise bad("no --hash=sha256:<hex>: every pin carries its wheels' hashes")
        key = normalize(name)
        if key in seen:
            raise bad(f"{name} is pinned twice (also line {seen[key]})")
        seen[key] = n
        pins.append(Pin(key, version, tuple(hashes), n))
    return pins


def _wheel_name_version(filename: str) -> tuple[str, str] | None:
    if not filename.endswith(".whl"):
        return None
    parts = filename[:-4].split("-")
    if len(parts) < 5:
        return None
    return normalize(parts[0]), parts[1]


def wheels_for(pins: list[Pin], wheels_dir: Path) -> dict[str, list[Path]]:
    """pin name -> the wheels in ``wheels_dir`` of its name and version (unchecked hashes)."""
    out: dict[str, list[Path]] = {p.name: [] for p in pins}
    by = {p.name: p for p in pins}
    for f in sorted(wheels_dir.iterdir()) if wheels_dir.is_dir() else []:
        nv = _wheel_name_version(f.name)
        if nv is None:
            continue
        pin = by.get(nv[0])
        if pin is not None and normalize(nv[1]) == normalize(pin.version):
            out[pin.name].append(f)
    return out


def wheel_problems(req: Path, bundle: Path) -> list[str]:
    """What ``check`` says of one requirements file: its first bad line, source distributions
    in ``wheels/``, pins no wheel covers, wheels whose sha256 the pin does not list."""
    try:
        pins = parse(req)
    except RequirementsError as exc:
        return [str(exc)]
    except OSError as exc:
        return [f"{req}: cannot read: {exc.strerror or exc}"]
    wheels_dir = bundle / WHEELS
    problems = []
    if wheels_dir.is_dir():
        for f in sorted(wheels_dir.iterdir()):
            if f.name.endswith(_SOURCE_SUFFIXES):
                problems.append(f"{WHEELS}/{f.name}: a source distribution (building one runs "
                                "its code): only wheels are installed")
    found = wheels_for(pins, wheels_dir)
    for pin in pins:
        files = found[pin.name]
        if not files:
            problems.append(f"{req.name} line {pin.line}: no wheel for {pin.name}=={pin.version} "
                            f"in {WHEELS}/ (`oarbank-sdk bundle wheels {bundle}`)")
            continue
        for f in files:
            if sha256_file(f) not in pin.hashes:
                problems.append(f"{WHEELS}/{f.name}: its sha256 is not one of the hashes "
                                f"{req.name} line {pin.line} pins")
    return problems


# --- installing one (the node's steps) ---------------------------------------------------------

HOST_PTH = "zz-oarbank-host.pth"  # processed after the environment's own .pth files


def sees_system_site() -> bool:
    """Whether this interpreter sees the base installation's site folder: not a venv, or one
    made with ``--system-site-packages``. An environment sees what the host sees, no more."""
    if sys.prefix == sys.base_prefix:
        return True
    try:
        cfg = (Path(sys.prefix) / "pyvenv.cfg").read_text(encoding="utf-8")
    except OSError:
        return False
    return any(line.replace(" ", "").lower() == "include-system-site-packages=true"
               for line in cfg.splitlines())


def host_site_dirs() -> list[str]:
    """This interpreter's site folders (a venv's own, editable installs' found through them)."""
    import site

    dirs = [*site.getsitepackages(), *[p for p in sys.path if p.endswith("site-packages")]]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def host_identity() -> str:
    """What an environment built here depends on besides its pins (part of its digest)."""
    return "\0".join([os.path.abspath(sys.executable), sys.version, str(sees_system_site()),
                      *host_site_dirs()])


def env_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def env_purelib(env: Path) -> Path:
    found = sorted(env.glob("lib/python*/site-packages")) or [env / "Lib" / "site-packages"]
    return found[0]


def venv_argv(env: Path) -> list[str]:
    system = ["--system-site-packages"] if sees_system_site() else []
    return [sys.executable, "-I", "-m", "venv", *system, "--without-pip", str(env)]


def host_pth() -> str:
    """The ``.pth`` (``HOST_PTH``, in ``env_purelib``) that adds the host's site folders after
    the environment's own: the SDK and its closure are the host's; a pinned copy wins."""
    return "".join(f"import site; site.addsitedir({d!r})\n" for d in host_site_dirs())


# How the install step starts pip (``python -I -c PIP_BOOT <pip's folder> install ...``), run
# before ``host_pth`` is written, so its path is the environment's own plus pip's folder:
# - not the host's site folders: their .pth files add folders the sandbox does not let the step
#   read (an editable install's source, the agent's own among them), and pip lists every folder
#   on its path, failing on the first it cannot (its importlib backend, 3.11+; found on 3.12+,
#   whose venvs have no setuptools: looking it up for its User-Agent walks the whole path);
# - no IPv6 probe: importing pip imports urllib3, which opens an AF_INET6 socket to learn
#   whether IPv6 works unless ``socket.has_ipv6`` says no. An offline install needs no socket
#   and the sandbox refuses every one (and reports the attempt), so the step says no first.
PIP_BOOT = ("import runpy,socket,sys;socket.has_ipv6=False;sys.path.append(sys.argv.pop(1));"
            "runpy.run_module('pip',run_name='__main__',alter_sys=True)")


def pip_folder() -> str:
    """The folder this interpreter imports pip from (the install step's pip). Raises
    ``RequirementsError`` when it has none."""
    import importlib.util

    spec = importlib.util.find_spec("pip")
    if spec is None or not spec.origin:
        raise RequirementsError(f"{sys.executable} has no pip: a module environment is "
                                "installed with the host interpreter's pip")
    return os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))


def pip_argv(env: Path, bundle: Path, req: Path) -> list[str]:
    """The contract's install, run with the environment's interpreter (pip is the host's; see
    ``PIP_BOOT``). Raises ``RequirementsError`` (``pip_folder``)."""
    return [str(env_python(env)), "-I", "-c", PIP_BOOT, pip_folder(), "install", "--no-index",
            "--find-links", str(bundle / WHEELS), "--require-hashes", "--only-binary", ":all:",
            "--no-deps", "--ignore-installed", "--no-cache-dir", "--disable-pip-version-check",
            "--no-input", "--no-warn-script-location", "-r", str(req)]


def install_env(tmp: Path) -> dict[str, str]:
    """The exact environment of both steps: no pip configuration (no index, no constraint)."""
    return {"PATH": os.defpath, "HOME": str(tmp), "TMPDIR": str(tmp), "PYTHONUTF8": "1",
            "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1", "LANG": "C.UTF-8"}
