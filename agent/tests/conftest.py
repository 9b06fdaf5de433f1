"""Shared fixtures: real agents on tmp state dirs, test modules, and a guard that no process
of any test is left behind. Helpers live in agent_helpers.py (importable from the tests).

The darwin profile (``OARBANK_PLATFORM=darwin`` on Linux, ``nox -s tests_darwin_profile``):
the tests run as on a Mac. The tripwire is installed in this process too (a test's own
Linux-only call fails, naming it); a test that needs a Linux wall (Landlock, seccomp,
cgroups, pidfds, the process factory) is marked ``linux_only(reason)``, or listed here (a
whole file in ``LINUX_ONLY``, one test in ``LINUX_ONLY_TESTS``), and skips there and on a
Mac with ``linux only: <reason>``. Every test but those of ``NOT_IN_PROFILE_RUN`` and
``LINUX_ONLY`` is marked ``darwin_profile``: what ``.ci/run`` runs under the profile."""

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
    "test_factory_overlap.py": "the process factory (fork + the Linux sandbox)",
    "test_factory_given_up.py": "the process factory (fork + the Linux sandbox)",
    "test_host_pidfd.py": "pidfds",
    "test_refusals.py": "seccomp user notification",
    "test_sandbox_agent.py": "Landlock and seccomp walls",
    "test_isolation.py": "Landlock and seccomp walls",
    "test_systemd_unit.py": "systemd",
}
# Single tests that need Linux (file::name), and why.
LINUX_ONLY_TESTS = {
    "test_operate.py::test_an_agent_whose_starter_is_killed_stops_too":
        "an agent stops with its starter (PR_SET_PDEATHSIG)",
    "test_operate.py::test_json_log_file_a_clean_idle_stop_is_info":
        "a sandbox (under the profile there is none: auto says so on stderr)",
    "test_failure_reasons.py::test_a_failed_start_shows_its_last_stderr_line_bounded":
        "peak memory from /proc/<pid>/status",
    "test_hygiene.py::test_ten_thousand_connects_leave_nothing_behind":
        "memory and threads from /proc/<pid>/status",
    "test_web_agent.py::test_openai_client_jobs_reach_the_fastapi_service_and_survive_its_restart":
        "a sandbox (it checks the walls are enforced)",
}
# What .ci/run's run under the darwin profile (the darwin_profile marker) leaves out: files
# that ask no OS (their result is Linux's) or measure speed and fuzz rather than the platform.
# Every other file is in, so a new test runs under the profile from its first day.
NOT_IN_PROFILE_RUN = {
    "test_tree.py", "test_platform_seam.py", "test_readme_options.py", "test_demo_compare.py",
    "test_hostile_agent.py",
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
        if item.path.name not in NOT_IN_PROFILE_RUN and item.path.name not in LINUX_ONLY:
            item.add_marker(pytest.mark.darwin_profile)
    if platform.name() == "linux":
        return
    for item in items:
        mark = item.get_closest_marker("linux_only")
        if mark is not None:
            reason = mark.args[0] if mark.args else mark.kwargs.get("reason", "a Linux wall")
        elif item.path.name in LINUX_ONLY:
            reason = LINUX_ONLY[item.path.name]
        elif f"{item.path.name}::{item.originalname}" in LINUX_ONLY_TESTS:
            reason = LINUX_ONLY_TESTS[f"{item.path.name}::{item.originalname}"]
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
