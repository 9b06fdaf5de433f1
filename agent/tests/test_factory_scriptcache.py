"""The factory's compiled scripts (platform/linux/factory/scriptcache.py), on real files: what
is kept, what never is, and that a changed file is never offered. How a child uses an offer,
against the direct path, is test_factory.py's."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from oarbank_agent.platform.linux.factory import scriptcache
from oarbank_agent.platform.linux.factory.scriptcache import ScriptCache, compile_script

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the process factory is Linux only (off elsewhere)")


def _script(path: Path, text: str, age_s: float = 60.0) -> str:
    path.write_text(text)
    old = time.time() - age_s
    os.utime(path, (old, old))
    return str(path)


def _run(code: object) -> dict[str, object]:
    scope: dict[str, object] = {"__name__": "__main__"}
    exec(code, scope)  # type: ignore[arg-type]
    return scope


def test_a_settled_script_is_compiled_as_a_fresh_start_would(tmp_path: Path) -> None:
    # This test module has `from __future__ import annotations`: a compile that inherited it
    # would leave the annotation a string. A fresh `python -I script.py` evaluates it.
    path = _script(tmp_path / "run.py", "def f(x: int) -> int: return x\nA = f.__annotations__\n")
    got = compile_script(path)
    assert isinstance(got, scriptcache.Compiled)
    assert got.path == path and got.code.co_filename == path
    assert _run(got.code)["A"] == {"x": int, "return": int}
    assert got.stamp == scriptcache.stamp_of(os.stat(path))


def test_a_file_written_just_now_is_not_kept_yet(tmp_path: Path) -> None:
    path = _script(tmp_path / "run.py", "X = 1\n", age_s=0)
    assert compile_script(path) is None  # not now: maybe later
    assert isinstance(compile_script(path, now=time.time() + scriptcache.SETTLE_S + 1),
                      scriptcache.Compiled)


@pytest.mark.parametrize("text", [
    b"if 1 is 1:\n    pass\n",  # SyntaxWarning: each child must print it
    b"def f(:\n",  # SyntaxError: each child must raise it
    b"x = 1\0\n",  # null byte: python's own ValueError/SyntaxError
    importlib.util.MAGIC_NUMBER + b"\0" * 12,  # a compiled file: runpy reads it
], ids=["warns", "syntax-error", "null-byte", "pyc"])
def test_what_a_compile_would_say_is_never_kept(tmp_path: Path, text: bytes) -> None:
    path = tmp_path / "run.py"
    path.write_bytes(text)
    os.utime(path, (time.time() - 60, time.time() - 60))
    got = compile_script(str(path))
    assert got == scriptcache.stamp_of(os.stat(path))  # refused as it is, not "not now"
    cache = ScriptCache()
    cache.learn(str(path))
    assert cache.offer(str(path)) is None and len(cache) == 0


# What each Python the project supports (noxfile's PYTHONS) does with these sources, measured
# with `compile(..., dont_inherit=True)` on 3.10.13, 3.11.2, 3.12.1, 3.13.0: the parser gives up
# on "deep" (MemoryError), the compiler on "long" (RecursionError); "nested" compiles everywhere.
_DEEP = b"x = " + b"-" * 60_000 + b"1\n"
_LONG = b"x = 1" + b" + 1" * 15_000 + b"\n"
_NESTED = b"x = " + b"-" * 50 + b"1\n"
_COMPILER_GIVES_UP = {
    (3, 10): {"deep": "refused", "long": "refused", "nested": "kept"},
    (3, 11): {"deep": "refused", "long": "refused", "nested": "kept"},
    (3, 12): {"deep": "refused", "long": "refused", "nested": "kept"},
    (3, 13): {"deep": "refused", "long": "refused", "nested": "kept"},
}


@pytest.mark.parametrize("name,text", [("deep", _DEEP), ("long", _LONG), ("nested", _NESTED)],
                         ids=["deep", "long", "nested"])
def test_a_source_the_compiler_gives_up_on_is_refused_not_fatal(tmp_path: Path, name: str,
                                                               text: bytes) -> None:
    """What the interpreter cannot compile is refused like a syntax error (the factory lives
    on); what it can compile is kept."""
    version = sys.version_info[:2]
    if version not in _COMPILER_GIVES_UP:
        pytest.fail(f"no expectation for Python {version[0]}.{version[1]}: measure what its "
                    "compile() does with these sources and add a row to _COMPILER_GIVES_UP")
    path = tmp_path / "run.py"
    path.write_bytes(text)
    os.utime(path, (time.time() - 60, time.time() - 60))
    got = compile_script(str(path))
    if _COMPILER_GIVES_UP[version][name] == "kept":
        assert isinstance(got, scriptcache.Compiled) and _run(got.code)["x"] == 1
    else:
        assert got == scriptcache.stamp_of(os.stat(path))


def test_a_changed_script_is_never_offered(tmp_path: Path) -> None:
    cache = ScriptCache()
    path = _script(tmp_path / "run.py", "V = 1\n")
    assert cache.offer(path) is None  # nothing learnt yet
    cache.learn(path)
    first = cache.offer(path)
    assert first is not None and _run(first.code)["V"] == 1
    # The same size, rewritten in place with its old times put back: the change time moves.
    text_ages = os.stat(path)
    Path(path).write_text("V = 2\n")
    os.utime(path, ns=(text_ages.st_atime_ns, text_ages.st_mtime_ns))
    assert cache.offer(path) is None
    # Replaced by a rename (a new inode), old times: not the file that was compiled either.
    new = _script(tmp_path / "new.py", "V = 3\n")
    os.replace(new, path)
    assert cache.offer(path) is None
    cache.learn(path)
    again = cache.offer(path)
    assert again is not None and _run(again.code)["V"] == 3
    os.unlink(path)
    assert cache.offer(path) is None


def test_a_refused_script_is_compiled_again_once_it_changes(tmp_path: Path) -> None:
    cache = ScriptCache()
    path = _script(tmp_path / "run.py", "if 1 is 1:\n    pass\n")
    cache.learn(path)
    assert cache.offer(path) is None
    _script(tmp_path / "run.py", "OK = True\n", age_s=30)
    cache.learn(path)
    got = cache.offer(path)
    assert got is not None and _run(got.code)["OK"] is True


def test_the_least_recently_used_script_goes_first(tmp_path: Path) -> None:
    cache = ScriptCache(limit=2)
    a, b, c = (_script(tmp_path / f"{n}.py", f"N = {n!r}\n") for n in "abc")
    cache.learn(a)
    cache.learn(b)
    assert cache.offer(a) is not None  # a is now the most recent
    cache.learn(c)
    assert len(cache) == 2
    assert cache.offer(b) is None and cache.offer(a) is not None and cache.offer(c) is not None


def test_a_script_over_the_size_cap_or_not_a_file_is_not_kept(tmp_path: Path) -> None:
    big = _script(tmp_path / "big.py", "#" * (scriptcache.MAX_SOURCE + 1) + "\n")
    cache = ScriptCache()
    cache.learn(big)
    cache.learn(str(tmp_path))  # a folder (runpy runs its __main__.py)
    cache.learn(str(tmp_path / "missing.py"))
    assert len(cache) == 0


def test_the_script_a_spawn_runs_in_place_is_found_behind_the_launcher() -> None:
    py = "/opt/agent-venv/bin/python"  # the factory's interpreter, as the agent names it
    boot = "import sys"
    env = {"LANG": "C.UTF-8"}
    locale = {"LANG": "C.UTF-8"}
    plain = [py, "-I", "/m/run.py", "run", "--spec", "s"]
    assert scriptcache.script_of(plain, env, py, boot, locale) == "/m/run.py"
    launched = [py, "-I", "-S", "-c", boot, "/d1", "/d2", "--net", "none", "--", *plain]
    assert scriptcache.script_of(launched, env, py, boot, locale) == "/m/run.py"
    # What is exec'd instead has no script here: -m, another interpreter, another locale,
    # a relative path, a launcher argv that does not parse.
    assert scriptcache.script_of([py, "-I", "-m", "x"], env, py, boot, locale) is None
    assert scriptcache.script_of(["/usr/bin/python3", "-I", "/m/run.py"], env, py, boot,
                                 locale) is None
    assert scriptcache.script_of(plain, {"LANG": "C"}, py, boot, locale) is None
    assert scriptcache.script_of([py, "-I", "run.py"], env, py, boot, locale) is None
    assert scriptcache.script_of([py, "-I", "-S", "-c", boot, "/d1", "/d2", "--bogus", "--",
                                  *plain], env, py, boot, locale) is None
