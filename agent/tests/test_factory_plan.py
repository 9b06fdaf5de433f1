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
    """``heldmodules.shadowed``: what makes the factory exec a script instead of running it in
    place. A folder of that name without ``__init__`` is a namespace portion (the standard
    library's module is found first); a module outside the standard library never counts (it
    is dropped before the script runs)."""
    import dataclasses  # noqa: F401  (held here: what a fresh start lacks)
    from pathlib import Path

    import pytest as _pytest  # noqa: F401  (held, not standard library)

    from oarbank_agent.platform.linux.factory import heldmodules

    folder = Path(str(tmp_path))
    held = heldmodules.snapshot(frozenset({"sys", "os"}))
    (folder / "dataclasses").mkdir()
    (folder / "pytest.py").write_text("")
    (folder / "os.py").write_text("")  # a fresh start has os already: both get the same
    assert heldmodules.shadowed(str(folder), held) is None
    (folder / "dataclasses" / "__init__.py").write_text("")
    assert heldmodules.shadowed(str(folder), held) == "dataclasses"
    assert heldmodules.shadowed(str(folder / "missing"), held) is None


def test_the_held_modules_are_taken_again_only_when_something_was_imported() -> None:
    """``heldmodules.snapshot``: the factory takes it once per spawn, a child again only if
    it imported since; a module imported after a snapshot must still be forgotten."""
    import types

    from oarbank_agent.platform.linux.factory import heldmodules

    fresh = frozenset({"sys", "os"})
    first = heldmodules.snapshot(fresh)
    assert heldmodules.snapshot(fresh, first) is first
    assert "oarbank_agent.platform.linux.factory.heldmodules" in first.foreign
    assert "os" not in first.foreign and "json" not in first.foreign  # standard library stays
    name = "oarbank_test_imported_after_the_snapshot"
    sys.modules[name] = types.ModuleType(name)
    try:
        later = heldmodules.snapshot(fresh, first)
        assert later is not first and name in later.foreign
        # (forgetting all of `later` here would drop pytest's own modules from this process)
        only = heldmodules.Held(later.count, frozenset(), (name,))
        heldmodules.forget(only, list(sys.meta_path), list(sys.path_hooks))
        assert name not in sys.modules
    finally:
        sys.modules.pop(name, None)
