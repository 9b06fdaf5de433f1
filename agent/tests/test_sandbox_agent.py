"""The sandbox through the REAL agent: every runner, service op and service daemon (and what
they start) is confined; the endpoint path still works; status says what is enforced; a
launcher that cannot confine refuses and the job fails with the sandbox's reason.

The probe module (modfiles/sandbox_probe.py) tries each operation for real against targets
this test creates OUTSIDE the sandbox (a TCP listener on 127.0.0.1 and on ::1, a listening
unix socket) and records the errno. The same probes with ``--sandbox off`` succeed, so the
refusals below are the sandbox's doing, not a broken probe.

Forcing a setup failure: ``OARBANK_SANDBOX_FAULT`` on the AGENT process (ops and runners get an
exact environment, so it cannot come from a job); the agent carries it to every launcher.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from agent_helpers import EXAMPLE, MODFILES, RunningAgent, alive  # noqa: E402

MODULE_ID = "test.agent.sbx"
REFUSED_OPS = ("tcp_listen_127.0.0.1", "udp_bind", "unix_path_listen", "abstract_unix_listen",
               "connect_127.0.0.1", "connect_::1", "connect_unix_outside", "socket_af_packet")
LINUX_CAPS = ("no_new_privs", "seccomp_listen", "seccomp_socket", "seccomp_bind_connect",
              "seccomp_io_uring", "loopback", "abstract_unix", "endpoints", "landlock_fs",
              "landlock_signal", "landlock_abstract_unix", "caps_dropped", "seccomp_ptrace",
              "seccomp_privileged", "devices", "agent_undumpable")
# Every non-network wall (modfiles/sandbox_probe.py walls()) and the errno the kernel answers:
# EACCES from Landlock (files, devices) and from the ptrace access check Landlock scopes
# (/proc/<agent>/environ, mem); EPERM from seccomp and from Landlock's signal scope.
WALLS = {
    "state_dir_create": "EACCES", "state_dir_append_limits": "EACCES",
    "procs_record_create": "EACCES", "forge_job_record": "EACCES", "forge_job_json": "EACCES",
    "list_jobs": "EACCES",
    "settings_rewrite": "EACCES", "bundle_create": "EACCES", "bundle_append_code": "EACCES",
    "host_tmp_create": "EACCES", "host_home_create": "EACCES", "list_dev": "EACCES",
    "dev_null_write": "ok", "open_block_device": "EACCES",
    "mount_tmpfs": "EPERM", "unshare_user": "EPERM", "unshare_mount": "EPERM",
    "bpf_map_create": "EPERM",
    "kill_agent": "EPERM", "kill_agent_group": "EPERM", "read_agent_environ": "EACCES",
    "read_agent_mem": "EACCES", "ptrace_attach_agent": "EPERM", "process_vm_readv_agent": "EPERM",
}
# What the agent itself changes while a job runs (records, logs, module data, each service's
# measured load times and uses for demand eviction); everything else of the state dir must be
# byte-identical after hostile jobs and services ran.
VOLATILE = ("jobs", "procs", "run", "logs", "service_stats.json")

MANIFEST = """\
manifest = 1

[module]
id = "test.agent.sbx"
version = "0.0.1"
description = "sandbox probes from a runner and a service daemon"

[requires]
core = ">=2.5,<3"
runner_protocol = [1]
service_protocol = [1]

[runner]
exec = ["python", "-I", "{bundle}/sandbox_probe.py"]
stop_grace_s = 2

[[stages]]
name = "probe"
timeout_s = 60

[[stages]]
name = "with_service"
timeout_s = 60
requires = { pools = { probe = 1 } }

[[services]]
name = "probe"
exec = ["python", "-I", "{bundle}/sandbox_probe.py"]
lifecycle = "on_demand"
idle_timeout_s = 60
start_timeout_s = 30
stop_timeout_s = 10
provides = { pools = ["probe"] }
"""


@pytest.fixture
def probe_module(tmp_path: Path) -> Path:
    root = tmp_path / "mod-sbx"
    root.mkdir()
    shutil.copy(MODFILES / "sandbox_probe.py", root / "sandbox_probe.py")
    (root / "oarbank-module.toml").write_text(MANIFEST)
    return root


@pytest.fixture
def targets() -> Iterator[dict[str, Any]]:
    """Listeners outside any sandbox: reachable from here, so a refusal inside is the sandbox."""
    with contextlib.ExitStack() as stack:
        t4 = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
        t4.bind(("127.0.0.1", 0))
        t4.listen(16)
        tcp6 = None
        with contextlib.suppress(OSError):  # a machine without IPv6 loopback: see the probe
            t6 = stack.enter_context(socket.socket(socket.AF_INET6, socket.SOCK_STREAM))
            t6.bind(("::1", 0))
            t6.listen(16)
            tcp6 = t6.getsockname()[1]
        short = tempfile.mkdtemp(prefix="oarbank-sbx-")  # sun_path is short: not under tmp_path
        stack.callback(shutil.rmtree, short, True)
        u = stack.enter_context(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        u.bind(os.path.join(short, "outside.sock"))
        u.listen(16)
        host_tmp = tempfile.mkdtemp(prefix="oarbank-sbx-host-")  # a folder of the host's /tmp
        stack.callback(shutil.rmtree, host_tmp, True)
        block = next((d for d in ("/dev/vda", "/dev/sda", "/dev/nvme0n1", "/dev/xvda",
                                  "/dev/loop0") if os.path.exists(d)), None)
        conf = {"tcp4": t4.getsockname()[1], "tcp6": tcp6, "unix_path": u.getsockname(),
                "host_tmp": host_tmp, "host_home": os.path.expanduser("~"),
                "block_device": block, "walls": True, "token": os.urandom(4).hex()}
        # Reachable from outside the sandbox (the test's own sanity check).
        with socket.create_connection(("127.0.0.1", conf["tcp4"]), timeout=2):
            pass
        with socket.socket(socket.AF_UNIX) as c:
            c.connect(conf["unix_path"])
        yield conf


def _not_refused(where: str, probes: dict[str, str]) -> list[str]:
    return [f"{where}: {op} -> {probes.get(op, 'not tried')} (expected EPERM)"
            for op in REFUSED_OPS if probes.get(op) != "EPERM"]


def _walls_not_held(where: str, probes: dict[str, str], block: bool) -> list[str]:
    out = []
    if probes.get("agent_found") == "no":
        out.append(f"{where}: could not find the agent's pid (probe broken)")
    for op, want in WALLS.items():
        if op == "open_block_device" and not block:
            continue
        got = probes.get(op, "not tried")
        if got != want:
            out.append(f"{where}: {op} -> {got} (expected {want})")
    return out


def _tree_digest(root: Path, skip_top: tuple[str, ...] = ()) -> dict[str, str]:
    """{relative path: sha256} of every regular file (module data and logs skipped)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if rel.parts[0] in skip_top or (len(rel.parts) > 2 and rel.parts[0] == "modules"
                                        and rel.parts[2] in ("data", "logs")):
            continue
        if p.is_file() and not p.is_symlink():
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _hostile_files(*roots: Path) -> list[str]:
    return [str(p) for r in roots if r.is_dir() for p in r.rglob("hostile-*")]


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _start(start_agent: Callable[..., RunningAgent], probe_module: Path,
           targets: dict[str, Any], *args: str, **kw: Any) -> RunningAgent:
    return start_agent([probe_module, EXAMPLE],
                       {MODULE_ID: targets, "modelserver": {"load_s": 0.1}},
                       extra_args=list(args), **kw)


def test_runner_and_service_daemon_are_refused_every_network_operation(
        start_agent: Callable[..., RunningAgent], probe_module: Path,
        targets: dict[str, Any]) -> None:
    agent = _start(start_agent, probe_module, targets)  # default: --sandbox auto
    # The hostile probes really try (an unconfined run would write the host's $HOME): where the
    # walls are missing this fails here, naming them, before anything is tried.
    sb = agent.status()["sandbox"]
    missing = {k: sb.get(k) for k in LINUX_CAPS if sb.get(k) != "enforced"}
    assert not missing, f"the sandbox lacks walls here, not running the hostile job: {missing}"
    state_before = _tree_digest(agent.state_dir, VOLATILE)
    bundle_before = _tree_digest(probe_module)
    job = agent.run_job("with_service", {}, module=MODULE_ID)
    assert job["state"] == "succeeded", job
    runner = job["result"]["payload"]["probes"]
    data = agent.module_data(MODULE_ID)
    service = _read(data / "probes-service.json")
    op_start = _read(data / "probes-op-start.json")
    failures = (_not_refused("runner", runner["self"])
                + _not_refused("runner's child (grandchild of the agent)", runner["child"])
                + _not_refused("service op start", op_start)
                + _not_refused("service daemon", service["self"])
                + _not_refused("service daemon's child", service["child"]))
    assert not failures, "not refused by the sandbox:\n" + "\n".join(failures)
    block = bool(targets["block_device"])
    walls = (_walls_not_held("runner", runner["self"], block)
             + _walls_not_held("runner's child", runner["child"], block)
             + _walls_not_held("service op start", op_start, block)
             + _walls_not_held("service daemon", service["self"], block)
             + _walls_not_held("service daemon's child", service["child"], block))
    assert not walls, "walls that did not hold:\n" + "\n".join(walls)
    # Nothing on disk changed: the state dir (but what the agent itself writes while a job
    # runs), the bundle, and no hostile-* file anywhere (state dir, bundle, host /tmp, $HOME).
    assert _tree_digest(agent.state_dir, VOLATILE) == state_before
    assert _tree_digest(probe_module) == bundle_before
    assert not _hostile_files(agent.state_dir, probe_module, Path(targets["host_tmp"]))
    in_home = list(Path(targets["host_home"]).glob(f"hostile-{targets['token']}-*"))
    for p in in_home:  # a broken wall's leftovers: reported below, not left in $HOME
        if p.read_bytes() == b"hostile":
            p.unlink()
    assert not in_home, f"written into the host's $HOME: {in_home}"
    assert "hostile" not in (agent.state_dir / "jobs" / job["job_id"] / "job.json").read_text()
    assert alive(agent.pid), "the agent did not survive its jobs and services"

    # The daemon itself, seen from outside: no_new_privs and a seccomp filter.
    daemon_pid = int((data / "daemon.pid").read_text())
    status_text = Path(f"/proc/{daemon_pid}/status").read_text()
    assert "\nNoNewPrivs:\t1\n" in status_text and "\nSeccomp:\t2\n" in status_text

    # Same sandbox, endpoint path end to end: a generate job through examples/modelserver.
    gen = agent.run_job("generate", {"prompts": ["under the sandbox"]}, module="modelserver")
    assert gen["state"] == "succeeded", gen
    assert gen["result"]["provenance"]["service_pids"], gen["result"]

    # A runner's OWN exit 70 is its failure, not the launcher's.
    own = agent.run_job("probe", {"exit": 70}, module=MODULE_ID)
    assert own["state"] == "failed" and own["reason"] == "runner exited with 70", own

    sb = agent.status()["sandbox"]
    assert sb["mode"] == "auto"
    not_enforced = {k: sb.get(k) for k in LINUX_CAPS if sb.get(k) != "enforced"}
    assert not not_enforced, f"status does not report these as enforced: {not_enforced}"
    assert sb["macos_seatbelt"] == "unavailable"  # never claimed where it does not apply
    human = agent.cli("status", "--state-dir", str(agent.state_dir))
    assert human.returncode == 0, human.stderr
    assert "sandbox (auto): endpoints enforced;" in human.stdout, human.stdout


def test_sandbox_off_runs_unconfined_and_status_says_so(
        start_agent: Callable[..., RunningAgent], probe_module: Path,
        targets: dict[str, Any]) -> None:
    agent = _start(start_agent, probe_module, dict(targets, walls=False), "--sandbox", "off")
    job = agent.run_job("probe", {}, module=MODULE_ID)
    assert job["state"] == "succeeded", job
    # The probes are real: unconfined, the same operations work.
    for where in ("self", "child"):
        probes = job["result"]["payload"]["probes"][where]
        for op in ("tcp_listen_127.0.0.1", "udp_bind", "unix_path_listen", "abstract_unix_listen",
                   "connect_127.0.0.1", "connect_unix_outside"):
            assert probes[op] == "ok", f"{where}: {op} -> {probes[op]} without the sandbox"
    sb = agent.status()["sandbox"]
    assert sb["mode"] == "off" and "debugging only" in sb["note"], sb
    claimed = [k for k, v in sb.items() if v == "enforced"]
    assert not claimed, f"--sandbox off still claims: {claimed}"
    assert "debugging only" in agent.log()


def test_forced_setup_failure_fails_the_job_with_the_sandbox_reason(
        start_agent: Callable[..., RunningAgent], probe_module: Path,
        targets: dict[str, Any]) -> None:
    env = dict(os.environ, OARBANK_SANDBOX_FAULT="seccomp")
    agent = _start(start_agent, probe_module, targets, env=env)
    job = agent.run_job("probe", {}, module=MODULE_ID)
    assert job["state"] == "failed", job
    assert job["reason"].startswith("sandbox setup failed (exit 70): "), job["reason"]
    assert "unconfined" in job["reason"], job["reason"]  # "refusing to run ... unconfined"
    data = agent.module_data(MODULE_ID)
    ran = list((agent.state_dir / "jobs").rglob("ran"))
    assert not ran, "the runner ran although the launcher could not confine it"

    # A service: none of its ops ran (not even fingerprint); its row says why.
    row = agent.service_row("probe")
    assert "sandbox setup failed (exit 70)" in (row["error"] or ""), row
    assert not (data / "ops.log").exists(), (data / "ops.log").read_text()

    sb = agent.status()["sandbox"]
    assert "OARBANK_SANDBOX_FAULT=seccomp" in sb["fault"], sb


def _group_record(agent: RunningAgent, kind: str) -> dict[str, Any]:
    recs = [json.loads(p.read_text()) for p in (agent.state_dir / "procs").glob("*.json")]
    found = [r for r in recs if r["kind"] == kind]
    assert found, f"no {kind} group recorded: {recs}"
    return found[0]


def _intrude(cgroup: str) -> subprocess.Popen[bytes]:
    """An unconfined process (started here, outside any sandbox) moved into ``cgroup``."""
    intruder = subprocess.Popen(["sleep", "120"])
    Path(cgroup, "cgroup.procs").write_text(str(intruder.pid))
    status = Path(f"/proc/{intruder.pid}/status").read_text()
    assert "\nSeccomp:\t0\n" in status  # really unconfined
    return intruder


def test_an_unconfined_process_in_a_sandboxed_group_is_killed_and_fails_it(
        start_agent: Callable[..., RunningAgent], probe_module: Path,
        targets: dict[str, Any]) -> None:
    """The escape check (escapewatch): a process of a runner's or a service's group that is
    not confined (Seccomp 2, NoNewPrivs 1) is killed with its group, and the attempt or the
    service fails with reason sandbox_escape."""
    agent = _start(start_agent, probe_module, dict(targets, walls=False))
    st = agent.status()
    if st["containment"] != "cgroup":
        pytest.skip(f"needs cgroup containment to move a process into a group from outside "
                    f"(a process group cannot be joined from another session): "
                    f"{st['containment_note']}")
    job_id = agent.submit("probe", {"sleep_s": 60}, module=MODULE_ID)
    agent.wait_for(lambda: any(json.loads(p.read_text())["kind"] == "runner"
                               for p in (agent.state_dir / "procs").glob("*.json")), 30,
                   "the runner's group record")
    runner = _group_record(agent, "runner")
    t0 = time.monotonic()
    intruder = _intrude(runner["cgroup"])
    try:
        job = agent.wait(job_id, timeout=60)
        assert intruder.wait(timeout=30) == -9, "the unconfined process was not killed"
    finally:
        if intruder.poll() is None:
            intruder.kill()
            intruder.wait()
    assert job["state"] == "failed", job
    assert job["reason"].startswith("sandbox_escape: pid "), job["reason"]
    assert f"pid {intruder.pid} " in job["reason"] and "Seccomp 0" in job["reason"], job["reason"]
    assert time.monotonic() - t0 < 30, "not caught within a few checks"
    assert "sandbox_escape" in agent.log()

    # A service: its daemon's group.
    ok = agent.run_job("with_service", {}, module=MODULE_ID)
    assert ok["state"] == "succeeded", ok
    service = _group_record(agent, "service")
    intruder = _intrude(service["cgroup"])
    try:
        assert intruder.wait(timeout=30) == -9, "the unconfined process was not killed"
        agent.wait_for(lambda: "sandbox_escape" in (agent.service_row("probe")["error"] or ""),
                       30, "the service to fail with sandbox_escape")
    finally:
        if intruder.poll() is None:
            intruder.kill()
            intruder.wait()
    assert not alive(service["pgid"]), "the service's group was not ended with it"


def test_auto_warns_once_naming_each_missing_wall_and_required_lists_them(caplog) -> None:
    """What the agent says on a kernel lacking walls. This kernel has them all, so the policy
    is given a capability report with two of them unavailable (the real launcher is what
    measures it: see sdk/tests/test_sandbox.py)."""
    import logging

    from oarbank_agent.sandbox import policy as sandboxing
    from oarbank_sdk import sandbox

    caps = dict.fromkeys(sandbox.CAPABILITY_NAMES, "enforced")
    caps.update(landlock_fs="unavailable", landlock_signal="unavailable")
    policy = sandboxing.SandboxPolicy("auto", True, caps)
    assert [n for n, _ in policy.missing_walls()] == ["landlock_fs", "landlock_signal"]
    with caplog.at_level(logging.WARNING, logger="oarbank_agent.sandbox"):
        policy.warn_missing()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "landlock_fs unavailable (jobs and services can read and write the agent's state dir" \
        in warnings[0] and "landlock_signal unavailable (a job can signal" in warnings[0]
    full = sandboxing.SandboxPolicy("auto", True, dict.fromkeys(sandbox.CAPABILITY_NAMES,
                                                                "enforced"))
    assert full.missing_walls() == []
    assert set(sandboxing.required_walls()) <= set(sandbox.CAPABILITY_NAMES)
    assert set(sandboxing.required_walls()) <= set(sandbox.WALL_GAPS)


def test_required_starts_where_every_wall_is_enforced(
        start_agent: Callable[..., RunningAgent], probe_module: Path,
        targets: dict[str, Any]) -> None:
    agent = _start(start_agent, probe_module, dict(targets, walls=False), "--sandbox", "required")
    sb = agent.status()["sandbox"]
    assert sb["mode"] == "required"
    from oarbank_agent.sandbox.policy import required_walls
    assert {n: sb[n] for n in required_walls()} == dict.fromkeys(required_walls(), "enforced"), sb
    assert "lacks" not in agent.log()  # no missing-wall warning here
    assert "sandbox: Landlock ABI " in agent.log()  # checked at start
    job = agent.run_job("probe", {}, module=MODULE_ID)
    assert job["state"] == "succeeded", job


def test_walls_per_child_follow_the_manifest(tmp_path: Path) -> None:
    """What the agent hands each launcher: a runner writes only its workdir, a service only its
    module's data dir; the GPU nodes only for [sandbox].devices.gpu = "compute" (the harness's
    gpumodel), and the launcher argv carries them (none on a machine without a GPU)."""
    from oarbank_agent.modules.loaded import NodeInfo, load_module
    from oarbank_agent.sandbox import policy as sandboxing
    from oarbank_sdk import sandbox

    repo = Path(__file__).resolve().parents[2]
    node = NodeInfo.create(tmp_path, "n")
    gpu = load_module(repo / "harness" / "e2e" / "modules" / "gpumodel", tmp_path, {})
    plain = load_module(EXAMPLE, tmp_path, {})
    w = tmp_path / "jobs" / "j1" / "a1"
    rw, sw = sandboxing.runner_walls(plain, w), sandboxing.service_walls(plain, node)
    assert rw.write == (str(w),) and rw.signals == "scoped" and not rw.gpu
    assert str(plain.data_dir) in rw.read and str(plain.settings_file) in rw.read
    assert sw.write == (str(plain.data_dir),) and sw.signals == "open" and not sw.gpu
    assert str(node.limits_file) in sw.read and str(node.tools_file) in sw.read
    assert not any(str(tmp_path / "jobs") in p for p in (*sw.read, *sw.write))
    assert sandboxing.runner_walls(gpu, w).gpu and sandboxing.service_walls(gpu, node).gpu
    policy = sandboxing.SandboxPolicy("auto", True, {})
    argv = policy.wrap(["true"], sandboxing.service_walls(gpu, node))
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--dev"] == sandbox.gpu_devices()
    assert argv[argv.index("--guard-pid") + 1] == str(os.getpid())
    assert "--dev" not in policy.wrap(["true"], sandboxing.service_walls(plain, node))
    # --gpu: the driver's own needs besides the nodes (its abstract socket; /proc when not root)
    assert "--gpu" in argv
    assert "--gpu" not in policy.wrap(["true"], sandboxing.service_walls(plain, node))
    # A root agent says at load that CUDA cannot start inside the sandbox, and why
    note = sandboxing.gpu_driver_note(gpu, True, 0)
    assert note is not None and "run the agent as a non-root user" in note
    assert sandboxing.gpu_driver_note(gpu, True, 1000) is None
    assert sandboxing.gpu_driver_note(gpu, False, 0) is None  # unconfined: nothing to say
    assert sandboxing.gpu_driver_note(plain, True, 0) is None
