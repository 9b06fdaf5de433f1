"""`oarbank-sdk conform`: the reference module passes; each broken module fails with a line
naming its problem. Real processes, channels, descriptors and (where the machine allows it)
the real sandbox; nothing is faked.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from platform_marks import conform_kit  # sdk/tests

from oarbank_sdk import advice, conform

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "modelserver"
BROKEN = Path(__file__).resolve().parent / "broken_modules"


pytestmark = conform_kit


def sandbox_available() -> bool:
    try:
        from oarbank_sdk import sandbox
    except ImportError:
        return False
    return sandbox.available()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "oarbank_sdk", "conform", *args],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)


def processes_of(bundle: Path) -> list[str]:
    """Live processes started from ``bundle`` (its path is in their command line)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and str(bundle) in " ".join(p.info["cmdline"] or []):
                found.append(f"{p.pid} {p.info['cmdline']}")
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="session")
def broken_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("broken_modules")


@pytest.fixture
def broken(broken_root):
    """``broken(name)``: a copy of ``broken_modules/<name>`` with the shared ``_shared/*.py``
    copied in: a bundle runs only its own code (``{bundle}/../x`` is refused by the manifest
    check), so the modules share their code here, not through their manifests."""

    def get(name: str) -> Path:
        dst = broken_root / name
        if not dst.exists():
            shutil.copytree(BROKEN / name, dst)
            for f in (BROKEN / "_shared").glob("*.py"):
                shutil.copy(f, dst / f.name)
        return dst

    return get


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def in_process(bundle: Path, sandbox: bool | None) -> tuple[int, dict]:
    """conform.run in this process: also checks that it released every descriptor."""
    before = open_fds()
    out = io.StringIO()
    rc = conform.run(bundle, json_output=True, sandbox=sandbox, stream=out)
    assert open_fds() == before
    return rc, json.loads(out.getvalue())


def failures(report: dict) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in report["checks"] if c["status"] == "FAIL"}


# --- the reference module ----------------------------------------------------------------------


def test_reference_module_passes_with_zero_failed():
    done = cli(str(EXAMPLE))
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.fullmatch(r"dev\.example\.modelserver 0\.1\.0: \d+ passed, 0 failed, 0 skipped", lines[-1])
    checks = lines[:-1]
    assert all(re.match(r"(ok  |warn|skip) \S", line) for line in checks), checks
    for expected in ("manifest", "service model: start", "service model: hello",
                     "service model: ready", "service model: never listens (after ready)",
                     "golden hello", "golden several_prompts", "spec generate",
                     "spec unknown path is 404", "spec prompt missing is 400",
                     "spec body not JSON is 400",
                     "service model: never listens (after requests)", "service model: ended",
                     "service model: channel protocol", "service model: stop",
                     "service model: process group gone"):
        assert any(line.startswith(f"ok   {expected}:") or line == f"ok   {expected}"
                   for line in checks), (expected, checks)
    if sandbox_available():  # every process of the service watched: it tried nothing
        for when in ("after ready", "after requests"):
            assert any(line.startswith(f"ok   service model: no network attempts ({when}): none")
                       for line in checks), checks
    # The reference daemon says `ready` on the channel (the kit offers it, as an agent does).
    assert any(line.startswith("ok   service model: ready: after ") and
               line.endswith("(said on the channel; the ready op agrees)") for line in checks)
    # the daemon that said hello is gone
    pid = int(re.search(r"hello: pid (\d+)", done.stdout).group(1))
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_reference_module_json_report():
    done = cli(str(EXAMPLE), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["module"] == "dev.example.modelserver" and report["version"] == "0.1.0"
    assert report["failed"] == 0 and report["passed"] >= 15
    assert {c["status"] for c in report["checks"]} <= {"ok", "warn", "skip"}
    sandbox_line = next(c for c in report["checks"] if c["name"] == "sandbox")
    if sandbox_available():
        assert sandbox_line["status"] == "ok" and "seccomp_listen=enforced" in sandbox_line["detail"]
    else:
        assert sandbox_line["status"] == "warn" and "unconfined" in sandbox_line["detail"]


def test_reference_module_passes_unconfined_too():
    rc, report = in_process(EXAMPLE, sandbox=False)
    assert rc == 0, failures(report)
    assert report["failed"] == 0


# --- broken modules ---------------------------------------------------------------------------


@pytest.fixture
def no_leftovers(broken_root):
    """Whatever a broken module started must be gone after conform."""
    yield
    assert processes_of(broken_root) == []


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        ("listens_tcp", {
            "service echo: never listens (after ready)": r"pid \d+: TCP listening on 127\.0\.0\.1:\d+",
            "service echo: never listens (after requests)": r"TCP listening on 127\.0\.0\.1:\d+",
        }),
        ("listens_unix", {
            "service echo: never listens (after ready)": r"unix listening on /\S+/service\.sock",
            "service echo: never listens (after requests)": r"unix listening on /\S+/service\.sock",
        }),
        ("no_hello", {"service echo: hello": r"no hello within start_timeout_s \(2 s\)"}),
        ("never_ready", {
            "service echo: ready": r"not true within start_timeout_s \(6 s\); last answer: "
                                   r"\{\"running\": true, \"ready\": false\}",
        }),
        ("said_ready_op_false", {
            "service echo: ready": r"said on the channel, but the ready op answers "
                                   r"\{\"running\": true, \"ready\": false\}: an agent that "
                                   r"does not offer the ready feature polls the op",
        }),
        ("answers_500", {"spec echo": r"POST /echo: expected status 200, got 500"}),
        ("golden_differs", {
            "golden one": r'payload\.texts: expected \["A", "C"\], got \["A", "B"\]',
        }),
    ],
)
def test_broken_module_fails_naming_the_problem(module, expected, broken, no_leftovers):
    rc, report = in_process(broken(module), sandbox=False)
    assert rc == 1
    got = failures(report)
    assert set(got) == set(expected), got
    for name, pattern in expected.items():
        assert re.search(pattern, got[name]), (name, got[name])
    assert report["failed"] == len(expected)


def test_healthy_twin_of_the_broken_modules_passes(broken, no_leftovers):
    # The broken modules share one service and runner; with nothing broken they pass, so each
    # failure above comes from what its module breaks, not from the shared code.
    rc, report = in_process(broken("healthy"), sandbox=False)
    assert rc == 0, failures(report)
    # It never says `ready` on the channel: polled, and that passes.
    ready = next(c for c in report["checks"] if c["name"] == "service echo: ready")
    assert ready["status"] == "ok" and "the ready op polled" in ready["detail"], ready


needs_sandbox = pytest.mark.skipif(
    not sandbox_available(), reason="this machine cannot run the sandbox (seccomp/no_new_privs "
    "unavailable): the unconfined variants above still run")


@needs_sandbox
@pytest.mark.parametrize(("module", "call"), [("listens_tcp", "socket(AF_INET)"),
                                               ("listens_unix", "socket(AF_UNIX)")])
def test_sandbox_refused_listen_fails_the_network_attempts_check(module, call, broken,
                                                                no_leftovers):
    done = cli(str(broken(module)))
    assert done.returncode == 1, done.stdout
    fail_lines = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    attempts = [line for line in fail_lines if "no network attempts" in line]
    assert len(attempts) == 1, done.stdout
    pid = re.search(r"hello: pid (\d+)", done.stdout).group(1)
    # the call and the process that made it (its pid, comm and command line), from the kernel
    assert f"{call} by pid {pid} (python" in attempts[0], attempts[0]
    assert f"{broken(module)}/service.py {module.replace('listens', 'listen')} serve)" in attempts[0]
    # the daemon died of its PermissionError: the channel closed before `ready`
    assert any(line.startswith("FAIL service echo: ready: the service closed its channel")
               for line in fail_lines), done.stdout
    assert done.stdout.strip().splitlines()[-1].startswith(f"dev.test.broken_{module} 0.0.1: ")
    # 2 or 3 skipped: "never listens" is skipped when the dead daemon has left no process to
    # inspect by then, and passes when one is still there (timing, not the module).
    assert re.search(r": \d+ passed, 2 failed, [23] skipped$", done.stdout.strip()), done.stdout


@needs_sandbox
def test_a_service_that_hides_its_listen_attempts_fails_conform(broken, no_leftovers):
    # quiet_listen: socket/bind/listen in try/except OSError: pass, then bind/listen/connect on
    # a socketpair end it holds, all swallowed; it logs nothing and serves every request. Only
    # the kernel's word (seccomp user notification) can fail it: and it does, naming each call
    # and the process. In process: every descriptor of the watches is released.
    rc, report = in_process(broken("quiet_listener"), sandbox=None)
    got = failures(report)
    assert rc == 1 and list(got) == ["service echo: no network attempts (after ready)"], got
    detail = got["service echo: no network attempts (after ready)"]
    hello = next(c["detail"] for c in report["checks"] if c["name"] == "service echo: hello")
    pid = re.match(r"pid (\d+)", hello).group(1)
    assert re.fullmatch(
        rf"4 attempt\(s\) refused by the sandbox: socket\(AF_INET\), listen\(\), bind\(\), "
        rf"connect\(\) by pid {pid} \(python[\d.]*: \S+ -I {broken('quiet_listener')}/service\.py "
        rf"quiet_listen serve\)", detail), detail
    # everything else passes: the service really serves
    passed = {c["name"] for c in report["checks"] if c["status"] == "ok"}
    assert {"golden one", "spec echo", "service echo: ready",
            "service echo: no network attempts (after requests)",
            "service echo: never listens (after ready)"} <= passed


@needs_sandbox
def test_the_attempt_watch_is_what_fails_the_quiet_listener(broken, no_leftovers):
    # The test hook switches the watch off (the sandbox still refuses every call): the same
    # module then passes, and the report says loudly that the kit was weakened.
    env = dict(os.environ, OARBANK_CONFORM_FAULT="no_attempt_watch")
    done = subprocess.run([sys.executable, "-m", "oarbank_sdk", "conform",
                           str(broken("quiet_listener"))], capture_output=True, text=True,
                          timeout=240, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stdout
    assert ("warn network attempts: FAULT INJECTED (test only): "
            "OARBANK_CONFORM_FAULT=no_attempt_watch") in done.stdout
    assert "no network attempts" not in done.stdout
    env["OARBANK_CONFORM_FAULT"] = "nonsense"
    done = subprocess.run([sys.executable, "-m", "oarbank_sdk", "conform",
                           str(broken("quiet_listener"))], capture_output=True, text=True,
                          timeout=240, cwd=ROOT, env=env)
    assert done.returncode == 1
    assert "FAIL network attempts: OARBANK_CONFORM_FAULT='nonsense' is not a known fault" in done.stdout


def test_invalid_manifest_stops_at_the_manifest_check(tmp_path):
    (tmp_path / "oarbank-module.toml").write_text('manifest = 1\n[module]\nid = "x.y"\n'
                                                  'version = "1"\ncolour = "red"\n')
    rc, report = in_process(tmp_path, sandbox=False)
    assert rc == 1
    assert list(failures(report)) == ["manifest"]
    assert "colour" in failures(report)["manifest"]
    assert len(report["checks"]) == 1


def test_a_gpu_module_passes_here_and_a_root_run_says_cuda_would_not_start(tmp_path):
    # The reference module declared a shared GPU service: this machine has no GPU, and the
    # example's code never opens one, so everything passes; run by root, the kit says (as the
    # agent does at load) that CUDA's driver could not start inside the sandbox.
    module = tmp_path / "gpu"
    shutil.copytree(EXAMPLE, module, ignore=shutil.ignore_patterns("__pycache__"))
    toml = module / "oarbank-module.toml"
    text = toml.read_text().replace(
        "# gpu = { use = \"shared\", apis_any = [\"metal\", \"cuda\"] }",
        "gpu = { use = \"shared\", apis_any = [\"metal\", \"cuda\"] }")
    toml.write_text(text + '\n[sandbox]\ndevices.gpu = "compute"\n')
    rc, report = in_process(module, None)
    assert rc == 0, failures(report)
    said = [c["detail"] for c in report["checks"]
            if c["name"] == "sandbox" and c["status"] == "warn"]
    root_and_confined = os.geteuid() == 0 and sandbox_available()
    assert said == ([f"{advice.GPU_UNDER_ROOT}: run conform as an ordinary user"]
                    if root_and_confined else []), report["checks"]
