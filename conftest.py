"""Tests that need a system package: skipped on a bare machine, failed in CI.

`nox -s tests` must pass on a machine with only Python. A test that needs Chromium, Docker,
debootstrap or a PostgreSQL server asks for it through the `system_package` fixture:

    def test_x(system_package):
        system_package("chromium")

When the package is missing the test is skipped with one line naming the package and the
command that installs it, and the end of the run counts those skips. With
`OARBANK_REQUIRE_SYSTEM_PACKAGES=1` (set by `.ci/run`) the same test fails instead, so CI never
skips silently.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # testsupport, for every test tree

from testsupport.privilege import ROOT_SKIP_PREFIX  # noqa: E402

REQUIRE_ENV = "OARBANK_REQUIRE_SYSTEM_PACKAGES"
SKIP_PREFIX = "needs the system package"


@dataclass(frozen=True)
class SystemPackage:
    name: str  # the Debian package
    present: Callable[[], bool]

    @property
    def install(self) -> str:
        return f"apt-get install {self.name} (as root)"


def _chromium() -> bool:
    return Path("/usr/bin/chromium").exists()


def _docker() -> bool:
    # A running engine is as good as the package (the harness uses one when it finds it).
    return shutil.which("dockerd") is not None or Path("/var/run/docker.sock").exists()


def _postgres() -> bool:
    return bool(glob.glob("/usr/lib/postgresql/*/bin/postgres"))


PACKAGES = {p.name: p for p in (
    SystemPackage("chromium", _chromium),
    SystemPackage("docker.io", _docker),
    SystemPackage("debootstrap", lambda: shutil.which("debootstrap") is not None),
    SystemPackage("postgresql", _postgres),
    SystemPackage("systemd", lambda: shutil.which("systemd-analyze") is not None),
    # The harness's VM backend (qemu-img comes with it: qemu-utils is among its Recommends).
    SystemPackage("qemu-system-x86", lambda: shutil.which("qemu-system-x86_64") is not None),
    # Windows' own CPython under Wine (harness/nodes/wine.py, `nox -s windows`)
    SystemPackage("wine64", lambda: Path("/usr/lib/wine/wine64").exists()
                  or shutil.which("wine64") is not None),
)}


def require_system_package(name: str) -> None:
    """Skip (or, under OARBANK_REQUIRE_SYSTEM_PACKAGES=1, fail) unless `name` is installed."""
    pkg = PACKAGES[name]  # KeyError: a test asked for a package this file does not know
    if pkg.present():
        return
    line = f"{SKIP_PREFIX} {pkg.name}: {pkg.install}"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{line}; {REQUIRE_ENV}=1 forbids skipping", pytrace=False)
    pytest.skip(line)


@pytest.fixture(scope="session")
def system_package() -> Callable[[str], None]:
    return require_system_package


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    missing: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        if SKIP_PREFIX in reason:
            pkg = reason.split(SKIP_PREFIX, 1)[1].split(":", 1)[0].strip()
            missing[pkg] = missing.get(pkg, 0) + 1
    if missing:
        total = sum(missing.values())
        each = ", ".join(f"{n} for {p}" for p, n in sorted(missing.items()))
        terminalreporter.write_line(
            f"{total} tests skipped for missing system packages ({each}); install them with "
            f"`apt-get install {' '.join(sorted(missing))}` to run them", yellow=True, bold=True)
    rootless = sum(1 for report in terminalreporter.stats.get("skipped", [])
                   if isinstance(report.longrepr, tuple)
                   and f"{ROOT_SKIP_PREFIX}: " in report.longrepr[2])
    if rootless:
        terminalreporter.write_line(
            f"{rootless} tests skipped because they need root (uid {os.geteuid()} ran them); run "
            f"the suite as root to run them too", yellow=True, bold=True)


# Tests that make real memory pressure: two at once would each see the other's allocation as
# pressure of their own, so under pytest-xdist they share one worker.
MEMORY_PRESSURE = ("test_memory_pressure.py", "test_yield_", "[yield-")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(m in item.nodeid for m in MEMORY_PRESSURE):
            item.add_marker(pytest.mark.xdist_group("memory-pressure"))
        elif "[container" in item.nodeid:
            # One worker for the container backend: its module-scoped engine and image are
            # set up once there, not by several workers at once.
            item.add_marker(pytest.mark.xdist_group("containers"))
