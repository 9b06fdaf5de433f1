"""A pytest plugin: the stack of every socket a test drops unclosed.

Load it with ``-p testsupport.sockettrace --socket-trace DIR`` (``nox -s flakes`` does). It
remembers where each ``socket.socket`` of the test process was made (every socket the standard
library makes, ``socketpair``, ``accept`` and ``fromfd`` included, goes through its constructor);
collects garbage after each test, so that a drop lands in the test that made it; and writes one
JSON line per drop to ``DIR/<pid>.jsonl`` (each xdist worker its own file). The run's summary
lists them with their stacks, and ``testsupport.flakes`` gathers them over its rounds.

The suite's ``filterwarnings = error`` turns the ``ResourceWarning`` of a socket finalised
unclosed into an "unraisable" exception whose object is the socket (or the asyncio transport
that held it): that is what the stack is looked up by. (Sockets of the agents and services the
tests start live in other processes; their own tests count the descriptors those hold.)
Not tracemalloc: tracing every allocation made the suite's imports alone 15 times slower.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import sys
import traceback
import weakref
from pathlib import Path
from typing import Any

import pytest

FRAMES = 30  # deep enough to get from asyncio or socket internals back into the test
_RUNNER_FRAMES = ("/_pytest/", "/pluggy/", "/xdist/", "/execnet/")  # the same in every stack
_current_test = "(between tests)"
_out: Path | None = None
_made_at: weakref.WeakKeyDictionary[socket.socket, list[str]] = weakref.WeakKeyDictionary()


def _remember_where_sockets_are_made() -> None:
    original = socket.socket.__init__

    def __init__(self: socket.socket, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        frames = traceback.extract_stack(limit=FRAMES)[:-1]
        _made_at[self] = [f"{f.filename}:{f.lineno} in {f.name}: {f.line}" for f in frames
                          if not any(part in f.filename for part in _RUNNER_FRAMES)]

    socket.socket.__init__ = __init__  # type: ignore[method-assign]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--socket-trace", metavar="DIR", default=None,
                     help="write the stack of every socket dropped unclosed under DIR")


def _stack_of(obj: Any) -> list[str]:
    sock = obj if isinstance(obj, socket.socket) else getattr(obj, "_sock", None)  # a transport
    try:
        return _made_at[sock]
    except (KeyError, TypeError):
        return [f"(not a socket made while tracing: {type(obj).__name__})"]


def _record(kind: str, obj: Any, message: str) -> None:
    if _out is None:
        return
    row = {"test": _current_test, "kind": kind, "object": message, "stack": _stack_of(obj)}
    with open(_out / f"{os.getpid()}.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")


def _chain_unraisablehook() -> None:
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, ResourceWarning):
            _record("unraisable", unraisable.object, str(unraisable.exc_value))
        previous(unraisable)

    sys.unraisablehook = hook


@pytest.hookimpl(trylast=True)  # after pytest's own unraisable hook, so ours runs first
def pytest_configure(config: pytest.Config) -> None:
    global _out
    where = config.getoption("--socket-trace")
    if where is None:
        return
    _out = Path(where)
    _out.mkdir(parents=True, exist_ok=True)
    _remember_where_sockets_are_made()
    _chain_unraisablehook()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    global _current_test
    _current_test = item.nodeid
    try:
        return (yield)
    finally:
        _current_test = "(between tests)"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    try:
        return (yield)
    finally:
        if _out is not None:
            gc.collect()  # what the test dropped is finalised now, while it is the current test


def pytest_warning_recorded(warning_message: Any, when: str, nodeid: str, location: Any) -> None:
    # A test that lets ResourceWarning through as a warning (not an error) still gets traced.
    if issubclass(warning_message.category, ResourceWarning):
        _record("warning", getattr(warning_message, "source", None), str(warning_message.message))


def read_drops(where: Path) -> list[dict[str, Any]]:
    """Every drop recorded under ``where`` (all workers)."""
    rows: list[dict[str, Any]] = []
    for path in sorted(where.glob("*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def format_drops(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for row in rows:
        out.append(f"{row['test']}: {row['object']}")
        out += [f"    {line}" for line in row["stack"]]
    return out


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if _out is None or hasattr(config, "workerinput"):  # the controller reports for all workers
        return
    rows = read_drops(_out)
    if rows:
        terminalreporter.section(f"sockets dropped unclosed: {len(rows)} (testsupport.sockettrace)")
        for line in format_drops(rows):
            terminalreporter.write_line(line)
