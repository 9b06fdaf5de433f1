"""python -m harness: listing, bad usage, and a run whose backend cannot run."""

from __future__ import annotations

import subprocess
import sys

from harness_test_helpers import REPO


def _harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_list_names_every_scenario_and_backend() -> None:
    r = _harness("--list")
    assert r.returncode == 0
    for name in ("idle-stop", "agent-restart", "crash-loop", "listener-refused",
                 "gpu-shared-start", "yield"):
        assert name in r.stdout
    assert "backends: local, container:bookworm, container:trixie" in r.stdout


def test_unknown_backend_and_scenario_exit_2_naming_what_is_known() -> None:
    r = _harness("--backend", "vm:sid")
    assert r.returncode == 2
    assert "unknown backend 'vm:sid'; known: local, container, vm, wine, container:bookworm" \
        in r.stderr and "vm:bookworm" in r.stderr
    r = _harness("--scenario", "nope")
    assert r.returncode == 2
    assert "unknown scenario(s) nope; known:" in r.stderr and "idle-stop" in r.stderr


def test_opt_in_scenarios_run_only_when_named() -> None:
    import harness.e2e.scenarios  # noqa: F401  (registers the scenarios)
    from harness.e2e.cli import default_scenarios
    from harness.e2e.scenario import SCENARIOS

    assert SCENARIOS["oom-limit"].opt_in  # needs the memory controller: not on every kernel
    assert "oom-limit" not in default_scenarios()
    assert {"agent-restart", "agent-upgrade", "idle-stop", "listener-refused",
            "yield"} <= set(default_scenarios())
