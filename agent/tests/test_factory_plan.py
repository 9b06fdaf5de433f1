"""The process factory's pure decisions (factory/plan.py): which argv is the sandbox launcher's
(parsed with the launcher's own parser), and which command may run in place."""

from __future__ import annotations

import sys

import pytest

from oarbank_agent.platform.linux.factory import plan
from oarbank_sdk import sandbox

PY = sys.executable
BOOT = sandbox.LAUNCHER_BOOT


def test_the_launchers_argv_is_split_into_its_request_and_the_command() -> None:
    argv = sandbox.wrap([PY, "-I", "/m/run.py", "run"], read=["/m"], write=["/w"],
                        signals="open", guard_pids=(4242,), notify_fd=9)
    got = plan.split_launch(argv, PY, BOOT)
    assert got.command == (PY, "-I", "/m/run.py", "run")
    assert got.request is not None
    assert got.request.read == ("/m",) and got.request.write == ("/w",)
    assert got.request.signals == "open" and got.request.guard_pids == (4242,)
    assert got.request.notify_fd == 9 and got.fault is None


def test_the_fault_hook_in_front_of_the_launcher_is_carried() -> None:
    argv = ["/usr/bin/env", f"{sandbox.FAULT_ENV}=seccomp",
            *sandbox.wrap(["/bin/true"], guard_pids=(7,))]
    got = plan.split_launch(argv, PY, BOOT)
    assert got.fault == "seccomp" and got.command == ("/bin/true",)


@pytest.mark.parametrize("argv", [["/bin/sh", "-c", "true"], [PY, "-I", "x.py"],
                                  [PY, "-m", "oarbank_sdk.sandbox.launch", "--", "x"]])
def test_anything_else_runs_as_it_is(argv: list[str]) -> None:
    got = plan.split_launch(argv, PY, BOOT)
    assert got.request is None and got.command == tuple(argv)


def test_launcher_options_that_do_not_parse_are_the_launchers_error() -> None:
    with pytest.raises(sandbox.UsageError, match="--net"):
        plan.split_launch([PY, "-I", "-m", "oarbank_sdk.sandbox.launch", "--net", "host",
                           "--", "x"], PY, BOOT)


LOCALE: dict[str, str] = {}


@pytest.mark.parametrize(("command", "env", "expect"), [
    ([PY, "-I", "/b/run.py", "run", "--spec", "s"], {}, ("/b/run.py", ["/b/run.py", "run",
                                                                        "--spec", "s"])),
    ([PY, "/b/run.py"], {}, None),  # without -I: other flags, sys.path[0], PYTHON* vars
    ([PY, "-I", "-u", "/b/run.py"], {}, None),  # an option the factory does not have
    ([PY, "-I", "-c", "pass"], {}, None),
    ([PY, "-I", "-m", "mod"], {}, None),
    ([PY, "-I", "-"], {}, None),
    (["/usr/bin/python3", "-I", "/b/run.py"], {}, None),  # another interpreter
    ([PY, "-I", "/b/run.py"], {"LANG": "de_DE.UTF-8"}, None),  # another locale
    ([PY, "-I", "/b/run.py"], {"PYTHONUTF8": "1", "HOME": "/h"}, ("/b/run.py",
                                                                  ["/b/run.py"])),
])
def test_only_python_dash_i_script_with_the_same_locale_runs_in_place(
        command: list[str], env: dict[str, str], expect: object) -> None:
    assert plan.in_place(command, PY, env, LOCALE) == expect


def test_unknown_mode_is_refused_by_name() -> None:
    from oarbank_agent import factory

    with pytest.raises(ValueError, match="--process-factory 'maybe'"):
        factory.resolve_mode("maybe", "linux")
    assert factory.resolve_mode("on", "darwin")[0] is False
    assert factory.resolve_mode("on", "linux")[0] is True


def test_a_scripts_folder_shadows_a_held_stdlib_module_only_with_a_module_file(
        tmp_path: object) -> None:
    """``child._shadowed``: what makes the factory exec a script instead of running it in
    place. A folder of that name without ``__init__`` is a namespace portion (the standard
    library's module is found first); a module outside the standard library never counts (it
    is dropped before the script runs)."""
    import dataclasses  # noqa: F401  (held here: what a fresh start lacks)
    from pathlib import Path

    import pytest as _pytest  # noqa: F401  (held, not standard library)

    from oarbank_agent.platform.linux.factory import child

    folder = Path(str(tmp_path))
    startup = child.Startup(PY, [], {}, {}, [], BOOT, fresh_modules=frozenset({"sys", "os"}))
    (folder / "dataclasses").mkdir()
    (folder / "pytest.py").write_text("")
    (folder / "os.py").write_text("")  # a fresh start has os already: both get the same
    assert child._shadowed(str(folder), startup) is None
    (folder / "dataclasses" / "__init__.py").write_text("")
    assert child._shadowed(str(folder), startup) == "dataclasses"
    assert child._shadowed(str(folder / "missing"), startup) is None
