"""Shared fixtures: real agents on tmp state dirs, test modules, and a guard that no process
of any test is left behind. Helpers live in agent_helpers.py (importable from the tests)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import RunningAgent, processes_referencing, write_module  # noqa: E402


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
