"""The macOS launcher's Seatbelt profile, generated for a runner's and a service's walls (the
agent's own ``runner_walls``/``service_walls``, through the SDK's launcher arguments) and
parsed as the s-expressions it is: deny by default, no network allowed and every network
operation denied, the writable paths exactly the contract's (section 9: a runner writes only
its workdir, a service only its module's data dir), reads limited to what the Linux launcher
grants. Runs everywhere; that ``sandbox-exec`` compiles the profile and the kernel holds it,
only a Mac shows (the macOS workflow's agent tests run children under it where it confines)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from oarbank_sdk import sandbox
from oarbank_sdk.sandbox import _linux, _policy, _seatbelt, launch

# The profile's paths are compared with the Linux launcher's grants, which are POSIX paths.
POSIX_PATHS = pytest.mark.skipif(sys.platform == "win32", reason="the Seatbelt profile and the "
                                 "Linux launcher's grants are POSIX paths (macOS's and Linux's)")

policy = pytest.importorskip("oarbank_agent.sandbox.policy")

_TOKEN = re.compile(r'\s*(?:(;[^\n]*)|(\()|(\))|("(?:[^"\\]|\\.)*")|([^\s()";]+))')


class Str(str):
    """A string literal of the profile (a symbol is a plain str)."""


def parse(text: str) -> list:
    """The profile's top-level forms: lists of symbols, ``Str`` literals and lists."""
    stack: list[list] = [[]]
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip():
                raise ValueError(f"cannot parse the profile at {text[pos:pos + 40]!r}")
            break
        pos = m.end()
        comment, opening, closing, literal, symbol = m.groups()
        if opening:
            stack.append([])
        elif closing:
            if len(stack) == 1:
                raise ValueError("unbalanced ')'")
            done = stack.pop()
            stack[-1].append(done)
        elif literal is not None:
            stack[-1].append(Str(re.sub(r"\\(.)", r"\1", literal[1:-1])))
        elif symbol is not None:
            stack[-1].append(symbol)
    if len(stack) != 1:
        raise ValueError("unbalanced '('")
    return stack[0]


def rules(forms: list, verdict: str) -> list[tuple[list[str], list[list]]]:
    """(operations, filters) of each ``(allow ...)`` or ``(deny ...)`` form."""
    out = []
    for f in forms:
        if isinstance(f, list) and f and f[0] == verdict:
            ops = [x for x in f[1:] if isinstance(x, str) and not isinstance(x, Str)]
            out.append((ops, [x for x in f[1:] if isinstance(x, list)]))
    return out


def paths(forms: list, op: str, kind: str) -> set[str]:
    """The ``(kind "path")`` filters of every allow that grants ``op``."""
    return {flt[1] for ops, flts in rules(forms, "allow") if op in ops
            for flt in flts if flt[0] == kind}


@pytest.fixture
def module(tmp_path: Path) -> SimpleNamespace:
    bundle = tmp_path / "bundle"
    state = tmp_path / "state"
    data = state / "modules" / "m" / "data"
    for d in (bundle, data):
        d.mkdir(parents=True)
    manifest = SimpleNamespace(bundle=bundle, sandbox={})
    ctx = SimpleNamespace(manifest=manifest, settings_file=state / "settings" / "m.json",
                          data_dir=data)
    node = SimpleNamespace(limits_file=state / "limits.json", tools_file=state / "tools.json")
    return SimpleNamespace(ctx=ctx, node=node, state=state, workdir=state / "jobs" / "j" / "a1")


def generated(walls) -> tuple[_policy.LaunchRequest, list]:
    """The profile the macOS launcher would pass to sandbox-exec for these walls."""
    argv = sandbox.launcher_argv(read=walls.read, write=walls.write, gpu=walls.gpu,
                                 signals=walls.signals, guard_pids=(os.getpid(),))
    options = argv[argv.index("--net"):]  # what the launcher's main() parses
    request = _policy.parse_launch_args([*options, "python3", "-c", "pass"])
    out = launch.seatbelt_argv(request)
    assert out[:2] == [_seatbelt.SANDBOX_EXEC, "-p"] and out[3:] == ["python3", "-c", "pass"]
    return request, parse(out[2])


def _real(*ps: object) -> set[str]:
    return {os.path.realpath(str(p)) for p in ps}


def check_common(request: _policy.LaunchRequest, forms: list, module: SimpleNamespace) -> None:
    assert ["version", "1"] in forms
    assert ["deny", "default"] in forms
    for ops, _ in rules(forms, "allow"):
        assert not any(op.startswith(("network", "system-socket")) for op in ops), ops
    denied = {op for ops, _ in rules(forms, "deny") for op in ops}
    assert {"network-bind", "network-inbound", "network-outbound", "system-socket"} <= denied
    # Every allow that touches files names its paths: none reaches everything.
    for ops, flts in rules(forms, "allow"):
        if any(op.startswith(("file-read*", "file-write", "process-exec")) for op in ops):
            assert flts, f"an unfiltered allow: {ops}"
    # Devices: the Linux launcher's nodes, read and written, nothing else of /dev.
    assert paths(forms, "file-write-data", "literal") == set(_policy.SYSTEM_DEVICES)
    # Reads: the macOS system folders plus exactly what the Linux launcher grants beyond its
    # own system folders (the interpreter, the launcher's path, the --read grants).
    readable = paths(forms, "file-read*", "subpath")
    linux_extra = _real(*_linux._system_read(request.read)) - _real(*_policy.SYSTEM_READ)
    assert readable == set(_seatbelt.SYSTEM_READ) | linux_extra | _real(*request.write)
    assert paths(forms, "process-exec", "subpath") == readable
    # Never the state dir itself, nor the host's /tmp, nor a home folder at large.
    state = os.path.realpath(module.state)
    for p in readable:
        assert not state.startswith(p.rstrip("/") + "/"), f"{p} would read the state dir"
        assert p not in ("/", "/tmp", "/private/tmp", "/private/var", "/Users"), p


@POSIX_PATHS
def test_a_runner_writes_its_workdir_and_nothing_else(module: SimpleNamespace) -> None:
    walls = policy.runner_walls(module.ctx, module.workdir)
    request, forms = generated(walls)
    check_common(request, forms, module)
    assert paths(forms, "file-write*", "subpath") == _real(module.workdir)
    assert _real(module.ctx.manifest.bundle, module.ctx.settings_file, module.ctx.data_dir) \
        <= paths(forms, "file-read*", "subpath")


@POSIX_PATHS
def test_a_service_writes_its_data_dir_and_nothing_else(module: SimpleNamespace) -> None:
    walls = policy.service_walls(module.ctx, module.node)
    request, forms = generated(walls)
    check_common(request, forms, module)
    assert paths(forms, "file-write*", "subpath") == _real(module.ctx.data_dir)
    assert _real(module.ctx.manifest.bundle, module.ctx.settings_file, module.node.limits_file,
                 module.node.tools_file) <= paths(forms, "file-read*", "subpath")


def test_nothing_writable_is_a_path_that_cannot_exist() -> None:
    forms = parse(_seatbelt.profile([]))
    assert paths(forms, "file-write*", "subpath") == set()
    assert paths(forms, "file-write*", "literal") == {"/nonexistent/oarbank"}


def test_the_parser_reads_what_the_template_quotes() -> None:
    forms = parse(_seatbelt.profile(['/tmp/we"ird\\dir']))
    assert paths(forms, "file-write*", "subpath") == {'/tmp/we"ird\\dir'}
    with pytest.raises(ValueError, match="unbalanced"):
        parse("(deny default")
