"""Shared fixtures: real agents on tmp state dirs, test modules, and a guard that no process
of any test is left behind. Helpers live in agent_helpers.py (importable from the tests).

The darwin profile (``OARBANK_PLATFORM=darwin`` on Linux, ``nox -s tests_darwin_profile``):
the tests run as on a Mac. The tripwire is installed in this process too (a test's own
Linux-only call fails, naming it); a test that needs a Linux wall (Landlock, seccomp,
cgroups, pidfds, the process factory) is marked ``linux_only(reason)``, or its whole file is
listed in ``LINUX_ONLY``, and skips there, and on a Mac, with ``linux only: <reason>``. The
files of ``DARWIN_PROFILE`` are marked ``darwin_profile``: what ``.ci/run`` runs under the
profile (a selection that fits its time)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import RunningAgent, processes_referencing, write_module  # noqa: E402

from oarbank_agent import platform  # noqa: E402

# Files whose every test needs a Linux wall, and why.
LINUX_ONLY = {
    "test_containment.py": "cgroups v2 containment",
    "test_resourcelimits.py": "cgroups v2 memory and CPU limits",
    "test_factory.py": "the process factory (fork + the Linux sandbox)",
    "test_factory_start.py": "the process factory (fork + the Linux sandbox)",
    "test_host_pidfd.py": "pidfds",
    "test_refusals.py": "seccomp user notification",
    "test_sandbox_agent.py": "Landlock and seccomp walls",
    "test_isolation.py": "Landlock and seccomp walls",
    "test_systemd_unit.py": "systemd",
}
# What .ci/run runs under the darwin profile: the agent end to end on the POSIX path (jobs,
# warm services, the control plane, restarts), in a few minutes on two cores.
DARWIN_PROFILE = {
    "test_darwin_profile.py", "test_services.py", "test_statedir.py", "test_jobs.py",
    "test_lifecycle.py", "test_admission.py", "test_runner.py", "test_recovery.py",
}


def _profile() -> bool:
    return platform.name() == "darwin"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "linux_only(reason): needs a Linux wall; skipped under "
                            "the darwin profile and on macOS ('linux only: <reason>')")
    config.addinivalue_line("markers", "darwin_profile: run by .ci/run under the darwin profile")
    if _profile():
        platform.current()  # the tripwire, in this process too: nothing here may cheat


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in DARWIN_PROFILE:
            item.add_marker(pytest.mark.darwin_profile)
    if platform.name() == "linux":
        return
    for item in items:
        mark = item.get_closest_marker("linux_only")
        if mark is not None:
            reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "a Linux wall")
        elif item.path.name in LINUX_ONLY:
            reason = LINUX_ONLY[item.path.name]
        else:
            continue
        item.add_marker(pytest.mark.skip(reason=f"linux only: {reason}"))


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    base = tmp_path_factory.getbasetemp()
    yield
    left = processes_referencing(base)
    assert not left, "processes left behind by the tests:\n" + "\n".join(left)


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., RunningAgent]]:
    agents: list[RunningAgent] = []
    counter = iter(range(1000))

    def start(modules: list[Path], settings: dict[str, Any] | None = None,
              state_dir: Path | None = None, **kw: Any) -> RunningAgent:
        # kw: extra_args (to `oarbank-agent run`), env (the agent process's environment)
        a = RunningAgent(tmp_path / f"agent{next(counter)}", modules, settings or {}, state_dir,
                         **kw)
        agents.append(a)
        return a

    yield start
    errors = []
    for a in agents:
        try:
            a.stop()
        except AssertionError as exc:
            errors.append(str(exc))
    assert not errors, "\n".join(errors)


@pytest.fixture
def echo_module(tmp_path: Path) -> Path:
    return write_module(tmp_path / "mod-echo")
