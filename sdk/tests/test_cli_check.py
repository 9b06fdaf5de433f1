"""`oarbank-sdk check` as a user runs it: real subprocesses on real files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SEED = Path(__file__).parent / "manifests" / "seed"

VALID = """\
manifest = 1
[module]
id = "dev.example.cli"
version = "2.1.0"
[requires]
core = ">=2.5,<3"
service_protocol = [1]
[[services]]
name = "model"
exec = ["python", "{bundle}/svc.py"]
endpoint = true
provides = { pools = ["model"] }
[[stages]]
name = "generate"
requires.pools = { model = 1 }
"""


def run(*args: str, via: str = "cli") -> subprocess.CompletedProcess[str]:
    if via == "cli":
        cmd = [sys.executable, "-m", "oarbank_sdk.cli", *args]
    elif via == "package":
        cmd = [sys.executable, "-m", "oarbank_sdk", *args]
    else:
        # The script pip put beside this interpreter (PATH need not name the venv's bin).
        exe = shutil.which("oarbank-sdk", path=str(Path(sys.executable).parent)) or \
            shutil.which("oarbank-sdk")
        if exe is None:
            pytest.fail("the oarbank-sdk entry point is not installed (pip install -e sdk)")
        cmd = [exe, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def module(tmp_path: Path, text: str = VALID) -> Path:
    (tmp_path / "oarbank-module.toml").write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("via", ["cli", "package", "entry-point"])
def test_valid_module_prints_ok(tmp_path: Path, via: str) -> None:
    path = module(tmp_path)
    proc = run("check", str(path), via=via)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{path}: ok dev.example.cli 2.1.0\n"


def test_toml_path_and_seed_module() -> None:
    toml = SEED / "oarbank-module.toml"
    proc = run("check", str(toml), str(SEED))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The seed's [coordinator], [[operations]] and [goldens] are upstream's: one note each.
    notes = [
        "note coordinator: accepted, not acted on: upstream's coordinator (the module "
        "protocol: plans, operations, views) is not run by this project",
        "note operations: accepted, not acted on: module operations are registered and run by "
        "upstream's coordinator, not by this portal",
        "note goldens: accepted, not acted on: upstream's coordinator compares goldens; "
        "oarbank-sdk conform reads goldens/*.json itself (an upstream-format golden is "
        "skipped there)",
    ]
    assert proc.stdout.splitlines() == [
        f"{toml}: ok dev.example.modelserver 0.1.0", *notes,
        f"{SEED}: ok dev.example.modelserver 0.1.0", *notes,
    ]


def test_invalid_module_lists_every_problem(tmp_path: Path) -> None:
    text = VALID.replace(
        "endpoint = true", 'endpoint = true\nlifecycle = "manual"\ncolour = "red"').replace(
        "service_protocol = [1]\n", "")
    path = module(tmp_path, text)
    proc = run("check", str(path))
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{path}: INVALID"
    assert sorted(lines[1:]) == sorted([
        "services[0].colour: unknown key; [[services]] takes: name, exec, lifecycle, "
        "idle_timeout_s, start_timeout_s, stop_timeout_s, restart, endpoint, provides, "
        "reserves_host_memory, yieldable, gpu, platforms, freeze_ok",
        'services[0].lifecycle: an endpoint service cannot be "manual": the agent must start '
        "it to hand it its channel (use on_demand or always)",
        "requires.service_protocol: required, non-empty, when services are declared "
        "(write service_protocol = [1])",
    ])


def test_mixed_paths_exit_1_and_report_each(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    module(good)
    module(bad, VALID.replace('version = "2.1.0"', "version = 2"))
    proc = run("check", str(good), str(bad))
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        f"{good}: ok dev.example.cli 2.1.0",
        f"{bad}: INVALID",
        "module.version: expected a string, got an integer (2)",
    ]


def test_exec_paths_that_leave_the_bundle_are_refused_with_their_key(tmp_path: Path) -> None:
    # A module runs only its own code: the sandbox lets it read its bundle, not its neighbours.
    text = VALID.replace('exec = ["python", "{bundle}/svc.py"]',
                         'exec = ["python", "-I", "{bundle}/../shared/svc.py", "--cfg={bundle}/a/../b"]')
    text += '[runner]\nexec = ["{bundle}/../run"]\n'
    proc = run("check", str(module(tmp_path, text)))
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[1:] == [
        'runner.exec[0]: "{bundle}/../run" leaves the bundle: a path after {bundle} must stay '
        'inside it (no ".." component); copy shared code into the bundle',
        'services[0].exec[2]: "{bundle}/../shared/svc.py" leaves the bundle: a path after '
        '{bundle} must stay inside it (no ".." component); copy shared code into the bundle',
        'services[0].exec[3]: "--cfg={bundle}/a/../b" leaves the bundle: a path after {bundle} '
        'must stay inside it (no ".." component); copy shared code into the bundle',
    ]
    # inside the bundle, a dotted name or a deeper path is fine
    ok = VALID.replace('"{bundle}/svc.py"', '"{bundle}/bin/..svc.py", "{bundle}/x/y.py"')
    assert run("check", str(module(tmp_path, ok))).returncode == 0


def test_every_test_module_of_the_repository_stays_inside_its_bundle() -> None:
    repo = Path(__file__).resolve().parents[2]
    tomls = [p for p in repo.glob("**/oarbank-module.toml")
             if not any(part.startswith(".") for part in p.relative_to(repo).parts)]
    assert len(tomls) > 10
    leaving = [str(p) for p in tomls if "{bundle}/.." in p.read_text()]
    assert leaving == []


def test_syntax_error_and_missing_manifest(tmp_path: Path) -> None:
    path = module(tmp_path, 'manifest = 1\n[module]\nid = "a.b\n')
    proc = run("check", str(path))
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[1].startswith("toml: syntax error at line 3, column")
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run("check", str(empty))
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        f"{empty}: INVALID", f"oarbank-module.toml: no oarbank-module.toml in {empty}"]


def test_page_problems_name_file_and_json_path(tmp_path: Path) -> None:
    text = VALID.replace("service_protocol = [1]", 'service_protocol = [1]\nui_contract = ">=1.2"')
    text += '[ui]\npages = [{ id = "overview", title = "O", slot = "module", ' \
            'file = "ui/pages/overview.json" }]\n' \
            'panels = [{ id = "node", title = "N", slot = "node", file = "ui/panels/gone.json" }]\n'
    path = module(tmp_path, text)
    (tmp_path / "ui" / "pages").mkdir(parents=True)
    (tmp_path / "ui" / "pages" / "overview.json").write_text(json.dumps({
        "ui_contract": "1.2",
        "body": [{"type": "table", "source": {"query": "services"}, "columns": [{"key": "x"}]}],
    }), encoding="utf-8")
    proc = run("check", str(path))
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert lines[0] == f"{path}: INVALID"
    assert lines[1].startswith("ui/pages/overview.json: body[0].source.query: the \"services\" "
                               "query is UI contract 1.2")
    assert lines[2] == "ui.panels[0].file: ui/panels/gone.json does not exist in the bundle"
    assert len(lines) == 3


@pytest.mark.parametrize("args", [[], ["check"], ["frobnicate"], ["check", "--nope", "x"]])
def test_bad_command_line_is_a_usage_error(args: list[str]) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    assert "usage: oarbank-sdk" in proc.stderr
    assert proc.stdout == ""


def test_conform_is_registered() -> None:
    proc = run("conform", "--help")
    assert proc.returncode == 0
    assert "MODULE_DIR" in proc.stdout and "--json" in proc.stdout
    proc = run("conform")
    assert proc.returncode == 2 and "MODULE_DIR" in proc.stderr
