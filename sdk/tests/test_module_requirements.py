"""A module environment's ``requirements.txt`` (``manifest/requirements.py``): ``check``
refuses an unhashed, marker- or option-carrying line naming it, a source distribution and pins
the bundle's wheels do not cover; ``deps compile`` and ``bundle wheels`` (``deps.py``) make a
file and wheels that pass, with real pip against this machine's configured index."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest
from platform_marks import conform_kit  # sdk/tests

from oarbank_sdk import cli
from oarbank_sdk.manifest import requirements as reqs

MANIFEST = """manifest = 1

[module]
id = "test.sdk.envs"
version = "0.0.1"
description = "a module with an environment"

[requires]
core = ">=2.5,<3"
runner_protocol = [1]
platforms = ["linux-amd64", "darwin-arm64"]

[runner]
exec = ["python", "-I", "{bundle}/runner/run.py"]

[[stages]]
name = "go"
"""
FAKE = b"not really a zip: check only reads names and hashes"
SHA = hashlib.sha256(FAKE).hexdigest()


def module(tmp_path: Path, requirements: str, wheels: dict[str, bytes] | None = None) -> Path:
    mod = tmp_path / "mod"
    (mod / "runner").mkdir(parents=True)
    (mod / "oarbank-module.toml").write_text(MANIFEST)
    (mod / "runner" / "run.py").write_text("print('hi')\n")
    (mod / "runner" / "requirements.txt").write_text(requirements)
    if wheels is not None:
        (mod / "wheels").mkdir()
        for name, data in wheels.items():
            (mod / "wheels" / name).write_bytes(data)
    return mod


def check(mod: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli.main(["check", str(mod)])
    return rc, capsys.readouterr().out


GOOD = f"# a comment\nsix==1.17.0 \\\n    --hash=sha256:{SHA} --hash=sha256:{'0' * 64}\n"


def test_a_covered_file_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = check(module(tmp_path, GOOD, {"six-1.17.0-py2.py3-none-any.whl": FAKE}), capsys)
    assert rc == 0 and ": ok test.sdk.envs" in out, out


@pytest.mark.parametrize("line, why", [
    ("six==1.17.0", "no --hash"),
    (f"six==1.17.0 ; python_version > '3' --hash=sha256:{SHA}", "a marker"),
    ("--index-url https://example.invalid/simple", "an option (--index-url)"),
    (f"six>=1.16 --hash=sha256:{SHA}", "an exact pin"),
    (f"six==1.17.0 --hash=md5:{'0' * 32}", "--hash=sha256"),
    (f"six==1.17.0 --no-binary six --hash=sha256:{SHA}", "the only option allowed"),
    (f"six[extra]==1.17.0 --hash=sha256:{SHA}", "extras are not allowed"),
    (f"six==1.17.0 --hash=sha256:{SHA}\nSix==1.17.0 --hash=sha256:{SHA}", "pinned twice"),
])
def test_a_bad_line_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         line: str, why: str) -> None:
    text = f"# pins\n\n{line}\n"
    rc, out = check(module(tmp_path, text, {"six-1.17.0-py2.py3-none-any.whl": FAKE}), capsys)
    n = 3 + line.count("\n")
    assert rc == 1 and "INVALID" in out, out
    assert f"requirements.txt line {n}: " in out and why in out, out


def test_wheels_must_cover_every_pin_and_be_wheels(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    text = f"six==1.17.0 --hash=sha256:{SHA}\nidna==3.10 --hash=sha256:{SHA}\n"
    mod = module(tmp_path, text, {"six-1.17.0-py2.py3-none-any.whl": b"other bytes",
                                  "idna-3.10.tar.gz": FAKE})
    rc, out = check(mod, capsys)
    assert rc == 1, out
    assert "wheels/idna-3.10.tar.gz: a source distribution" in out, out
    assert "requirements.txt line 2: no wheel for idna==3.10" in out, out
    assert "wheels/six-1.17.0-py2.py3-none-any.whl: its sha256 is not one of" in out, out


def test_parse_reads_continuations_and_comments(tmp_path: Path) -> None:
    p = tmp_path / "requirements.txt"
    p.write_text(GOOD + f"Zope.Interface==7.0 --hash=sha256:{SHA}  # trailing\n")
    pins = reqs.parse(p)
    assert [(x.name, x.version, x.line) for x in pins] == [("six", "1.17.0", 2),
                                                           ("zope-interface", "7.0", 4)]
    assert pins[0].hashes == (SHA, "0" * 64)


@pytest.mark.skipif(importlib.util.find_spec("pip") is None,
                    reason="needs pip in this interpreter (Windows' embeddable CPython under Wine "
                           "has none)")
def test_deps_compile_and_bundle_wheels_make_a_module_that_checks(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Real pip against this machine's configured index, for both listed platforms: the file
    pins six with its wheel's hash (one pure-Python wheel serves both), the wheels cover it."""
    mod = module(tmp_path, "")
    (mod / "runner" / "requirements.txt").unlink()
    req_in = mod / "runner" / "requirements.in"
    req_in.write_text("six==1.17.0\n")
    assert cli.main(["deps", "compile", str(mod), str(req_in), "--pip"]) == 0, \
        capsys.readouterr()
    text = (mod / "runner" / "requirements.txt").read_text()
    (pin,) = reqs.parse(mod / "runner" / "requirements.txt")
    assert (pin.name, pin.version) == ("six", "1.17.0") and "linux-amd64, darwin-arm64" in text
    rc, out = check(mod, capsys)
    assert rc == 1 and "no wheel for six==1.17.0" in out, out
    assert cli.main(["bundle", "wheels", str(mod)]) == 0, capsys.readouterr()
    (whl,) = (mod / "wheels").iterdir()
    assert reqs.sha256_file(whl) in pin.hashes
    rc, out = check(mod, capsys)
    assert rc == 0, out


def test_deps_compile_says_what_cannot_be_resolved(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    mod = module(tmp_path, "")
    req_in = mod / "runner" / "requirements.in"
    req_in.write_text("this-distribution-does-not-exist-anywhere==0.0.1\n")
    assert cli.main(["deps", "compile", str(mod), str(req_in), "--pip",
                     "--platforms", "linux-amd64"]) == 1
    err = capsys.readouterr().err
    assert "pip download for linux-amd64 failed" in err, err


RUNNER = '''import json, sys
import six  # the module environment's: the host has none
if sys.argv[1:3] == ["doctor", "--json"]:
    print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                      "capabilities": [], "checks": [{"name": "six", "ok": True,
                                                      "detail": six.__file__}]}))
'''


@conform_kit
@pytest.mark.parametrize("with_env", [True, False], ids=["in-its-env", "without-it"])
def test_conform_runs_the_module_in_its_environment(tmp_path: Path, with_env: bool,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The runner imports six, which only its environment has: conform installs it (offline,
    sandboxed) and the doctor passes; without the requirements file the same doctor fails (the
    check can fail)."""
    with pytest.raises(ImportError):
        __import__("six")
    mod = module(tmp_path, "")
    (mod / "runner" / "run.py").write_text(RUNNER)
    req_in = mod / "runner" / "requirements.in"
    req_in.write_text("six==1.17.0\n")
    assert cli.main(["deps", "compile", str(mod), str(req_in), "--pip",
                     "--platforms", "linux-amd64"]) == 0
    assert cli.main(["bundle", "wheels", str(mod), "--platforms", "linux-amd64"]) == 0
    if not with_env:
        (mod / "runner" / "requirements.txt").unlink()
    capsys.readouterr()
    rc = cli.main(["conform", str(mod)])
    out = capsys.readouterr().out
    if with_env:
        assert "environment runner/requirements.txt: installed offline" in out, out
        assert rc == 0, out
    else:
        assert rc == 1 and "environment runner" not in out, out
        assert "FAIL runner doctor" in out and "No module named 'six'" in out, out
