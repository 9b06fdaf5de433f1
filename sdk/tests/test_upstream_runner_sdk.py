"""Upstream's runner-side SDK modules exist here by their names (control, platform, portable,
gpu, tools, secrets, folders, broker, runner_protocol), standard library only, and behave as
a runner written for upstream expects.

Upstream's names, signatures and constants are data (``upstream_runner_sdk.json`` beside this
file, read from upstream's source); ``test_every_upstream_runner_name_is_ours_compatibly``
holds our modules to it. The Control tests run a real runner process and play the agent's
part themselves: they write control.json and send SIGUSR1, as the runner protocol says.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oarbank_sdk import broker, folders, gpu, portable, secrets, tools
from oarbank_sdk import platform as pf
from oarbank_sdk.control import Checkpoints, Control, Stopped, replace_text

HERE = Path(__file__).resolve().parent
UPSTREAM = json.loads((HERE / "upstream_runner_sdk.json").read_text(encoding="utf-8"))
SDK_SRC = HERE.parent / "src"

posix_nudge = pytest.mark.skipif(sys.platform == "win32",
                                 reason="the POSIX nudge (SIGUSR1); Windows' is an event handle")

# --- upstream's names as data ------------------------------------------------------------------

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_BUILTIN_BASES = {"object": object, "Exception": Exception, "ValueError": ValueError,
                  "LookupError": LookupError, "RuntimeError": RuntimeError}


def _callable_problems(where: str, obj: object, d: dict) -> list[str]:
    """Where a call written for upstream's signature ``d`` would not bind the same on ``obj``."""
    params = list(inspect.signature(obj).parameters.values())  # type: ignore[arg-type]
    positional = [p for p in params if p.kind in _POSITIONAL]
    want = d["params"]
    problems = []
    if [p.name for p in positional[:len(want)]] != [w["name"] for w in want]:
        return [f"{where}: positional parameters {[p.name for p in positional]}, upstream's "
                f"start {[w['name'] for w in want]}"]
    for w, p in zip(want, positional, strict=False):
        if "default" in w:
            expected = ast.literal_eval(w["default"])
            if p.default is inspect.Parameter.empty or p.default != expected or \
                    type(p.default) is not type(expected) and not (
                        isinstance(expected, (int, float)) and isinstance(p.default, (int, float))):
                problems.append(f"{where}({p.name}): default {p.default!r}, upstream's "
                                f"{expected!r}")
        elif "default_factory" in w:
            field = {f.name: f for f in dataclasses.fields(obj)}[p.name]  # type: ignore[arg-type]
            if field.default_factory is dataclasses.MISSING or field.default_factory() != {}:
                problems.append(f"{where}({p.name}): no empty {w['default_factory']} default")
    for p in params[len(want):]:
        if p.kind is inspect.Parameter.VAR_POSITIONAL and d.get("variadic"):
            continue
        if p.default is inspect.Parameter.empty and p.kind not in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            problems.append(f"{where}: ours requires {p.name!r}, which upstream's callers omit")
    if d.get("variadic") and not any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        problems.append(f"{where}: takes no *args as upstream's does")
    names = {p.name for p in params}
    problems += [f"{where}: no keyword {k!r}" for k in d.get("keyword_only", ()) if k not in names]
    return problems


def _problems(module_name: str, spec: dict) -> list[str]:
    mod = importlib.import_module(f"oarbank_sdk.{module_name}")
    problems = []
    for name, d in spec["names"].items():
        where = f"{module_name}.{name}"
        if not hasattr(mod, name):
            problems.append(f"{where}: missing")
            continue
        ours = getattr(mod, name)
        kind = d["kind"]
        if kind == "constant":
            value = list(ours) if isinstance(ours, tuple) else ours
            if value != d["value"]:
                problems.append(f"{where} = {ours!r}, upstream's {d['value']!r}")
        elif kind == "pattern":
            problems += [f"{where} does not match {s!r}" for s in d["matches"]
                         if not ours.fullmatch(s)]
            problems += [f"{where} matches {s!r}" for s in d["refuses"] if ours.fullmatch(s)]
        elif kind == "set":
            problems += [f"{where} lacks {s!r}" for s in d["includes"] if s not in ours]
        elif kind == "function":
            if not callable(ours) or inspect.isclass(ours):
                problems.append(f"{where}: not a function")
                continue
            problems += _callable_problems(where, ours, d)
        elif kind == "class":
            if not inspect.isclass(ours):
                problems.append(f"{where}: not a class")
                continue
            problems += [f"{where}: not a subclass of {b}" for b in d["bases"]
                         if not issubclass(ours, _BUILTIN_BASES[b])]
            if d.get("dataclass") and not dataclasses.is_dataclass(ours):
                problems.append(f"{where}: not a dataclass")
            problems += [f"{where}.{m}: missing" for m in d.get("methods", ())
                         if not callable(getattr(ours, m, None))]
            if d["params"] or not issubclass(ours, BaseException):  # Exception(*args) as is
                problems += _callable_problems(where, ours, d)
        else:
            problems.append(f"{where}: unknown kind {kind!r} in the data")
    return problems


def test_every_upstream_runner_name_is_ours_compatibly():
    problems = []
    for module_name, spec in UPSTREAM["modules"].items():
        problems += _problems(module_name, spec)
    assert problems == []


def test_the_data_covers_what_upstreams_examples_import():
    imported = {m for mods in UPSTREAM["imported_by_examples"].values() for m in mods}
    assert imported - {"service_endpoint"} <= set(UPSTREAM["modules"])  # that one: its own data
    assert sum(len(s["names"]) for s in UPSTREAM["modules"].values()) >= 100


def test_the_check_can_fail():
    # A missing name, a moved parameter, another default, a required extra: each is caught.
    spec = {"names": {"current": {"kind": "function", "params": []},
                      "nothing_here": {"kind": "function", "params": []},
                      "resolve": {"kind": "function",
                                  "params": [{"name": "token"}, {"name": "mapping"}]},
                      "os_": {"kind": "function", "params": [{"name": "token", "default": "'x'"}]},
                      "ENV_PLATFORM": {"kind": "constant", "value": "OTHER"}}}
    found = _problems("platform", spec)
    assert len(found) == 4, found
    assert _callable_problems("f", lambda a, b: None, {"params": [{"name": "a"}]})
    assert not _callable_problems("f", lambda a, b=1, *, c=2: None,
                                  {"params": [{"name": "a"}], "keyword_only": ["c"]})


def _under_wine() -> bool:
    if sys.platform != "win32":
        return False
    import ctypes

    return hasattr(ctypes.WinDLL("ntdll"), "wine_get_version")  # type: ignore[attr-defined]


@pytest.mark.skipif(_under_wine(), reason="under Wine the child's gpu.detect() can hang (seen "
                    "in CI's windows step); the check is the same on every platform: Linux and "
                    "the windows-latest workflow run it")
def test_runner_side_modules_need_only_the_standard_library():
    # A clean interpreter (-I -S: no site-packages at all) with only the SDK's source on the
    # path imports every runner-side module, and nothing outside the standard library loads.
    names = [*UPSTREAM["modules"], "service_endpoint"]
    code = (f"import sys\nsys.path.insert(0, {str(SDK_SRC)!r})\n"
            f"for n in {names!r}:\n    __import__('oarbank_sdk.' + n)\n"
            "from oarbank_sdk import gpu\ngpu.detect()\n"
            "top = {m.split('.')[0] for m in sys.modules}\n"
            "print(sorted(top - set(sys.stdlib_module_names) - {'oarbank_sdk', '__main__',"
            " 'sitecustomize'}))")  # the Wine harness's own start-up hook (CopyFile2), not the SDK's
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# --- platform and portable ------------------------------------------------------------------------


def test_current_is_the_agents_token_else_this_machine(monkeypatch):
    monkeypatch.setenv("OARBANK_PLATFORM", "windows-arm64")
    assert (pf.current(), pf.os_(), pf.arch()) == ("windows-arm64", "windows", "arm64")
    for bad in ("", "darwin", "Linux-amd64", "linux amd64"):
        monkeypatch.setenv("OARBANK_PLATFORM", bad)
        assert pf.current() == portable.host_platform(), bad
    from oarbank_sdk import manifest
    assert portable.host_platform() == manifest.platform_token()
    assert pf.os_("darwin-arm64") == "darwin" and pf.arch("linux-amd64") == "amd64"


@pytest.mark.parametrize(("table", "token", "want"), [
    ({"linux": 2, "linux-amd64": 3}, "linux-amd64", 3),   # the token beats its OS
    ({"linux": 2, "linux-amd64": 3}, "linux-arm64", 2),   # then the OS
    ({"darwin": 2}, "linux-arm64", 1),                    # then the default
    (None, "linux-arm64", 1),
])
def test_resolve_most_specific_first(table, token, want):
    assert pf.resolve(table, token, default=1) == want


@pytest.mark.parametrize(("a", "b", "want"), [
    ("any", "same-os", "same-os"), ("same-os", "same-arch", "same-platform"),
    (None, None, "any"), ("bogus", "any", "same-platform"), ("same-arch", "same-arch", "same-arch"),
])
def test_stricter_of_two_mixes(a, b, want):
    assert pf.stricter(a, b) == want == pf.stricter(b, a)


def test_classes_and_variants():
    assert pf.class_key("linux-amd64", "same-os") == "linux"
    assert pf.class_key("linux-amd64", None) == "*"
    assert pf.class_key("linux-amd64", "what") == "linux-amd64"
    assert pf.looser("any", "same-os") and not pf.looser("same-platform", "same-os")
    assert pf.feasible_classes(["linux-amd64", "linux-arm64", "darwin-arm64"], [["linux"]], [],
                               "same-arch") == ["amd64", "arm64"]
    base = {"env": {"A": "1", "B": "2"}, "exec": ["x"]}
    assert pf.apply_variants(base, {"linux": {"env": {"B": "3"}, "exec": ["y"]}},
                             "linux-amd64") == {"env": {"A": "1", "B": "3"}, "exec": ["y"]}
    assert pf.is_key("linux") and pf.is_key("linux-amd64") and not pf.is_key("Linux")
    assert pf.declared("linux", ["linux-amd64"]) and not pf.declared("darwin", ["linux-amd64"])


def test_feasible_reads_our_manifest(tmp_path):
    from oarbank_sdk import manifest
    (tmp_path / "oarbank-module.toml").write_text(
        (HERE / "manifests" / "upstream" / "gpuinfo" / "oarbank-module.toml").read_text())
    m = manifest.load(tmp_path)
    assert pf.feasible(m, mix="same-os") == ["darwin", "linux", "windows"]
    with pytest.raises(ValueError, match="unknown stages"):
        pf.feasible(m, ["nope"])


@pytest.mark.parametrize(("path", "rule"), [
    ("frames/frame-0001.png", None), (".cfg", "not portable"), ("a/../b", "'..'"),
    ("/abs", "relative"), ("C:/x", "relative"), ("a\\b", "relative"), ("aux.txt", "device"),
    ("x" * 201, "longer"), ("caf\u00e9", "non-ASCII"), ("a./b", "ends with"), ("a b", "not portable"),
])
def test_portable_paths(path, rule):
    if rule is None:
        assert portable.check_portable_path(path) == path and portable.is_portable_path(path)
    else:
        with pytest.raises(portable.PathError, match=rule):
            portable.check_portable_path(path)
    assert portable.is_portable_path(".cfg", allow_dotfiles=True)
    assert portable.casefold_collisions(["A.txt", "b", "a.TXT"]) == [("A.txt", "a.TXT")]


# --- gpu ------------------------------------------------------------------------------------------


def test_gpu_helpers_and_detect_shape():
    found = gpu.detect()
    assert set(found) == {"host", "containers", "evidence"}
    assert found["host"] == sorted(found["host"]) and set(found["host"]) <= set(gpu.KNOWN_APIS)
    assert set(found["evidence"]) == set(gpu.KNOWN_APIS)
    assert all(isinstance(v, str) and v for v in found["evidence"].values())
    assert gpu.fits(["cuda", "vulkan"], ["vulkan"]) and gpu.fits([], []) and not gpu.fits(["metal"], [])
    needs = [{"apis": ["metal"], "where": "host"}, {"apis": ["cuda"], "where": "containers"}]
    assert gpu.unmet(needs, {"host": ["metal"]}) == [needs[1]]
    assert gpu.describe({"apis": ["cuda", "rocm"], "where": "host"}) == "one of cuda, rocm on the host"
    assert gpu.describe({"apis": ["vulkan"], "where": "containers"}) == "vulkan in containers"


# --- tools, secrets, folders, broker ---------------------------------------------------------------


def test_granted_files_are_read_and_absence_is_named(tmp_path, monkeypatch):
    for var in ("OARBANK_TOOLS_FILE", "OARBANK_SECRETS_FILE", "OARBANK_FOLDERS_FILE",
                "OARBANK_BROKER"):
        monkeypatch.delenv(var, raising=False)
    assert tools.all_tools() == {} and secrets.names() == [] and folders.all_folders() == {}
    with pytest.raises(tools.ToolMissing, match="'jdk' is not granted"):
        tools.path("jdk")
    with pytest.raises(secrets.SecretMissing, match="'key' was not delivered"):
        secrets.get("key")
    with pytest.raises(folders.FolderMissing, match="'inputs' is not granted"):
        folders.path("inputs")
    assert not broker.available()
    with pytest.raises(broker.BrokerError) as info:
        broker.run("img@sha256:x", ["true"])
    assert info.value.code == "no_broker"

    (tmp_path / "t.json").write_text(json.dumps(
        {"jdk": [{"path": "/opt/jdk", "version": "17.0.12", "arch": "aarch64"}],
         "ffmpeg": ["/usr/bin/ffmpeg"]}))
    (tmp_path / "s.json").write_text(json.dumps({"key": "v1"}))
    (tmp_path / "f.json").write_text(json.dumps({"out": {"path": "/srv/out", "access": "write"}}))
    monkeypatch.setenv("OARBANK_TOOLS_FILE", str(tmp_path / "t.json"))
    monkeypatch.setenv("OARBANK_SECRETS_FILE", str(tmp_path / "s.json"))
    monkeypatch.setenv("OARBANK_FOLDERS_FILE", str(tmp_path / "f.json"))
    assert (tools.path("jdk"), tools.version("jdk"), tools.arch("jdk")) == ("/opt/jdk", "17.0.12", "aarch64")
    assert tools.paths("ffmpeg") == ["/usr/bin/ffmpeg"] and tools.version("ffmpeg") is None
    assert secrets.get("key") == "v1" and secrets.names() == ["key"]
    assert folders.path("out", "write") == "/srv/out"
    with pytest.raises(folders.FolderMissing):
        folders.path("out")  # granted for writing, not reading
    (tmp_path / "t.json").write_text(json.dumps({"jdk": [7]}))
    with pytest.raises(ValueError, match="neither a path nor an object"):
        tools.all_tools()


# --- control: a real runner, this test as the agent --------------------------------------------------

RUNNER = r'''
import json, os, signal, sys, time
from pathlib import Path
from oarbank_sdk.control import Control, Stopped
work = Path(sys.argv[1])
ctl = Control(work)
ctl.phase("work")
done = 0
try:
    while done < 400:
        ctl.safe_point()
        done += 1
        (work / "done").write_text(str(done))
        time.sleep(0.02)
except Stopped:
    (work / "held.json").write_text(json.dumps({"paused_s": ctl.paused_s, "seq": ctl.seq,
                                                "threads": ctl.threads, "done": done}))
    sys.exit(ctl.acknowledge_stop())
(work / "held.json").write_text(json.dumps({"paused_s": ctl.paused_s, "done": done}))
'''


def _wait_for(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _start_runner(work: Path) -> subprocess.Popen:
    (work / "runner.py").write_text(RUNNER)
    env = dict(os.environ, OARBANK_MODULE="reelish", PYTHONPATH=str(SDK_SRC))
    # As the agent starts it: SIGUSR1 ignored until the runner installs its handler.
    return subprocess.Popen([sys.executable, str(work / "runner.py"), str(work)], env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN))


def _count(work: Path) -> int:
    try:
        return int((work / "done").read_text() or 0)
    except (OSError, ValueError):
        return 0


@posix_nudge
def test_a_runner_pauses_at_safe_points_and_stops_with_75(tmp_path):
    replace_text(tmp_path / "control.json", json.dumps({"seq": 0}))
    proc = _start_runner(tmp_path)
    try:
        _wait_for(lambda: (tmp_path / "phase").exists() and _count(tmp_path) > 2, what="work")
        replace_text(tmp_path / "control.json", json.dumps({"seq": 1, "pause": True, "threads": 2}))
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        held_at = _count(tmp_path)
        time.sleep(0.6)
        assert _count(tmp_path) == held_at  # holding at a safe point: no work
        # A document with an older seq, and a broken one, change nothing even when nudged.
        replace_text(tmp_path / "control.json", json.dumps({"seq": 0, "stop": True}))
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.2)
        (tmp_path / "control.json").write_text("{not json")
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.2)
        assert proc.poll() is None and _count(tmp_path) == held_at
        replace_text(tmp_path / "control.json", json.dumps({"seq": 2, "threads": 2}))
        proc.send_signal(signal.SIGUSR1)
        _wait_for(lambda: _count(tmp_path) > held_at + 2, what="resumed work")
        replace_text(tmp_path / "control.json", json.dumps({"seq": 3, "stop": True}))
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(10) == 75
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    held = json.loads((tmp_path / "held.json").read_text())
    assert held["paused_s"] >= 0.9 and held["seq"] == 3 and held["threads"] is None
    failure = json.loads((tmp_path / "failure.json").read_text())
    assert failure["fault"] == "transient" and failure["reason"] == "reelish/stopped"
    assert (tmp_path / "phase").read_text() == "work\n"


@posix_nudge
def test_a_runner_with_no_control_document_is_never_held(tmp_path):
    proc = _start_runner(tmp_path)
    assert proc.wait(60) == 0
    assert json.loads((tmp_path / "held.json").read_text()) == {"paused_s": 0.0, "done": 400}


def test_control_reads_only_well_formed_newer_documents(tmp_path):
    ctl = Control(tmp_path)
    assert (ctl.seq, ctl.stop, ctl.pause) == (-1, False, False)
    for doc in ([1], {"seq": "3", "stop": True}, {"seq": True, "stop": True}):
        (tmp_path / "control.json").write_text(json.dumps(doc))
        assert ctl.refresh() is False and not ctl.stop
    (tmp_path / "control.json").write_text(json.dumps(
        {"seq": 4, "stop": True, "checkpoint": True, "threads": 0, "gpu_duty": 0.5}))
    assert ctl.refresh() is True and ctl.checkpoint_requested
    assert ctl.threads is None and ctl.gpu_duty == 0.5  # 0 threads is no limit, not a limit of 0
    with pytest.raises(Stopped):
        ctl.safe_point()
    assert ctl.refresh() is False  # the same seq again


def test_checkpoints_are_announced_and_found_on_resume(tmp_path):
    events = tmp_path / "events.ndjson"
    ck = Checkpoints(tmp_path, events, {})
    assert ck.resume() is None and ck.resume_data() == {}
    with ck.write({"next": 4}) as d:
        (d / "frames").mkdir()
        (d / "frames" / "f0.png").write_bytes(b"png")
        (d / "state.json").write_text("{}")
    [event] = [json.loads(x) for x in events.read_text().splitlines()]
    assert event["kind"] == "checkpoint" and event["data"] == {"next": 4}
    assert event["files"] == [{"path": "ckpt/000001/frames/f0.png", "name": "frames/f0.png"},
                              {"path": "ckpt/000001/state.json", "name": "state.json"}]
    with pytest.raises(ValueError, match="holds no file"), ck.write({}):
        pass
    with pytest.raises(ValueError, match="at most|the most is 4096"), ck.write({"x": "y" * 5000}):
        pass
    with pytest.raises(RuntimeError, match="no --events file"), Checkpoints(tmp_path).write():
        pass
    (tmp_path / "checkpoint").mkdir()
    resumed = Checkpoints(tmp_path, None, {"resume": {"from_attempt": 1, "data": {"next": 4}}})
    assert resumed.resume_data() == {"next": 4} and resumed.resume_dir() == tmp_path / "checkpoint"


def test_replace_text_leaves_no_temporary_file(tmp_path):
    replace_text(tmp_path / "phase", "one\n")
    replace_text(str(tmp_path / "phase"), "two\n")
    assert (tmp_path / "phase").read_text() == "two\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["phase"]
