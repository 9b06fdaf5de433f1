"""A test module (runner AND service) that tries every operation the sandbox must refuse.

Each operation is tried for real and recorded as "ok" (it worked) or the errno name it failed
with ("EPERM", ...), in-process ("self") and from a process it starts ("child": a grandchild
of the agent for the runner, a great-grandchild for the service daemon). Standard library only.

Targets come from the node settings (OARBANK_SETTINGS_FILE), set up by the test OUTSIDE the
sandbox: {"tcp4": port on 127.0.0.1, "tcp6": port on ::1 or null, "unix_path": a listening
unix socket's path, "host_tmp": a folder of the host's /tmp, "host_home": the host's $HOME,
"block_device": a block device node that exists here (or null)}.

Besides the network, ``walls()`` tries every other wall of the sandbox as a hostile job would
(contract section 9): write the agent's state dir, forge a job record, rewrite the settings,
write the bundle, the host's /tmp and $HOME, signal the agent and its process group, read
/proc/<agent>/environ, ptrace and read the agent's memory, mount, unshare, bpf, open a disk and
list /dev. Every file it tries to make is named ``hostile-*`` (the test looks for any).

A runner records into its workdir (the only place it may write); a service into its data dir.

    sandbox_probe.py run --spec S --workdir W --out R    runner: probes -> result.json
    sandbox_probe.py probe                               print the probes as one JSON line
    sandbox_probe.py <op>                                service ops (fingerprint, start, ...)
    sandbox_probe.py serve                               the service daemon
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def settings() -> dict:
    try:
        return json.loads(Path(os.environ["OARBANK_SETTINGS_FILE"]).read_text())
    except (KeyError, OSError, ValueError):
        return {}


def data() -> Path:
    return Path(os.environ["OARBANK_MODULE_DATA"])


def _try(fn) -> str:
    try:
        fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc)) if exc.errno else f"error: {exc}"
    except Exception as exc:  # noqa: BLE001 - recorded, the test says what happened
        return f"error: {type(exc).__name__}: {exc}"
    return "ok"


def probes() -> dict[str, str]:
    conf = settings()
    tag = f"{os.getpid()}"

    def tcp_listen() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            s.listen(1)

    def udp_bind() -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))

    def unix_path_listen() -> None:
        # Relative to the working folder: short enough for sun_path whatever the tmp root.
        name = f"probe-{tag}.sock"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.bind(name)
                s.listen(1)
        finally:
            if os.path.exists(name):
                os.unlink(name)

    def abstract_listen() -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.bind(f"\0oarbank-probe-{tag}")
            s.listen(1)

    def connect(family: int, addr: object) -> None:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(addr)

    def packet() -> None:
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW):
            pass

    out = {
        "tcp_listen_127.0.0.1": _try(tcp_listen),
        "udp_bind": _try(udp_bind),
        "unix_path_listen": _try(unix_path_listen),
        "abstract_unix_listen": _try(abstract_listen),
        "connect_127.0.0.1": _try(lambda: connect(socket.AF_INET, ("127.0.0.1", conf["tcp4"]))),
        "connect_unix_outside": _try(lambda: connect(socket.AF_UNIX, conf["unix_path"])),
        "socket_af_packet": _try(packet),
    }
    if conf.get("tcp6"):
        out["connect_::1"] = _try(lambda: connect(socket.AF_INET6, ("::1", conf["tcp6"])))
    else:  # the test checks ::1 is reachable from outside before relying on this
        out["connect_::1"] = _try(lambda: connect(socket.AF_INET6, ("::1", 9)))
    return out


def state_dir() -> Path:
    # OARBANK_SETTINGS_FILE = <state>/modules/<module id>/settings.json
    return Path(os.environ["OARBANK_SETTINGS_FILE"]).parents[2]


def agent_pid() -> int | None:
    """The agent running on our state dir (its command line is world-readable)."""
    want = str(state_dir())
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "oarbank_agent" in " ".join(args) and "run" in args and any(
                a.rstrip("/") == want or a.endswith(want) for a in args):
            return int(name)
    return None


_SYS = {"x86_64": {"ptrace": 101, "mount": 165, "unshare": 272, "bpf": 321,
                   "process_vm_readv": 310},
        "aarch64": {"ptrace": 117, "mount": 40, "unshare": 97, "bpf": 280,
                    "process_vm_readv": 270}}


def _syscall(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    nr = _SYS[os.uname().machine][name]
    rc = libc.syscall(ctypes.c_long(nr), *args)
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _create(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"hostile")
    os.close(fd)


def _append(path: Path) -> None:
    with open(path, "ab") as f:
        f.write(b"\n# hostile\n")


def walls() -> dict[str, str]:
    """Every non-network wall, tried for real; {attempt: "ok" | errno name}. Only when the
    settings say ``"walls": true`` (unconfined, these attempts would really do the damage)."""
    conf = settings()
    if not conf.get("walls"):
        return {}
    state = state_dir()
    tag = f"hostile-{conf.get('token', 'x')}-{os.getpid()}"
    bundle = Path(__file__).resolve().parent
    agent = agent_pid()
    out = {
        "state_dir_create": _try(lambda: _create(state / tag)),
        "state_dir_append_limits": _try(lambda: _append(state / "limits.json")),
        "procs_record_create": _try(lambda: _create(state / "procs" / f"{tag}.json")),
        "forge_job_record": _try(lambda: (state / "jobs" / tag).mkdir()),
        "settings_rewrite": _try(lambda: Path(os.environ["OARBANK_SETTINGS_FILE"]).write_text(
            '{"hostile": true}')),
        "bundle_create": _try(lambda: _create(bundle / tag)),
        "bundle_append_code": _try(lambda: _append(bundle / "sandbox_probe.py")),
        "host_tmp_create": _try(lambda: _create(Path(conf["host_tmp"]) / tag)),
        "host_home_create": _try(lambda: _create(Path(conf["host_home"]) / tag)),
        "list_dev": _try(lambda: os.listdir("/dev")),
        "dev_null_write": _try(lambda: Path("/dev/null").write_text("x")),
        "mount_tmpfs": _try(lambda: _syscall("mount", b"none", os.getcwd().encode(), b"tmpfs",
                                             ctypes.c_ulong(0), None)),
        "unshare_user": _try(lambda: _syscall("unshare", ctypes.c_long(0x10000000))),
        "unshare_mount": _try(lambda: _syscall("unshare", ctypes.c_long(0x00020000))),
        "bpf_map_create": _try(lambda: _syscall("bpf", ctypes.c_long(0), None, ctypes.c_long(0))),
    }
    out["list_jobs"] = _try(lambda: os.listdir(state / "jobs"))
    if "OARBANK_WORKDIR" in os.environ:  # a runner: its own record, one level above its workdir
        out["forge_job_json"] = _try(
            lambda: _append(Path(os.environ["OARBANK_WORKDIR"]).parent / "job.json"))
    else:  # a service: a record of its own making
        out["forge_job_json"] = _try(lambda: _create(state / "jobs" / f"{tag}.json"))
    if conf.get("block_device"):
        out["open_block_device"] = _try(lambda: os.close(os.open(conf["block_device"],
                                                                 os.O_RDONLY)))
    if agent is not None:
        out["kill_agent"] = _try(lambda: os.kill(agent, signal.SIGCONT))
        out["kill_agent_group"] = _try(lambda: os.killpg(os.getpgid(agent), signal.SIGCONT))
        out["read_agent_environ"] = _try(lambda: Path(f"/proc/{agent}/environ").read_bytes())
        out["read_agent_mem"] = _try(lambda: Path(f"/proc/{agent}/mem").open("rb").close())
        out["ptrace_attach_agent"] = _try(lambda: _syscall("ptrace", ctypes.c_long(16),
                                                           ctypes.c_long(agent), None, None))
        buf = ctypes.create_string_buffer(8)
        iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), 8)
        out["process_vm_readv_agent"] = _try(lambda: _syscall(
            "process_vm_readv", ctypes.c_long(agent), iov, ctypes.c_ulong(1), iov,
            ctypes.c_ulong(1), ctypes.c_ulong(0)))
    else:
        out["agent_found"] = "no"
    return out


def probes_here_and_in_child() -> dict[str, dict[str, str]]:
    child = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), "probe"],
                           capture_output=True, text=True, timeout=60, check=False)
    try:
        in_child = json.loads(child.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        in_child = {"error": f"child exited {child.returncode}: {child.stderr[-500:]}"}
    return {"self": {**probes(), **walls()}, "child": in_child}


def write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def run_runner(args: list[str]) -> int:
    spec = json.loads(Path(args[args.index("--spec") + 1]).read_text())
    out = Path(args[args.index("--out") + 1])
    workdir = Path(args[args.index("--workdir") + 1])
    payload = spec.get("payload", {})
    (workdir / "ran").write_text(str(os.getpid()))
    if "exit" in payload:  # the runner's OWN exit code (e.g. 70, which is not the launcher's)
        return int(payload["exit"])
    if "sleep_s" in payload:  # a runner that stays (the escape check test)
        time.sleep(float(payload["sleep_s"]))
    result = {"probes": probes_here_and_in_child(), "pid": os.getpid()}
    write_json(out, {"envelope": 1, "payload": result})
    return 0


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _daemon_pid() -> int | None:
    try:
        return int((data() / "daemon.pid").read_text())
    except (OSError, ValueError):
        return None


def op(name: str) -> int:
    with open(data() / "ops.log", "a") as f:  # evidence that an op really ran
        f.write(f"{name} {os.getpid()}\n")
    if name == "fingerprint":
        doc: dict = {"service_protocol": {"supported": [1]}, "health": "healthy",
                     "pools": {"probe": 2}, "running": _alive(_daemon_pid())}
    elif name == "start":
        write_json(data() / "probes-op-start.json", {**probes(), **walls()})
        if not _alive(_daemon_pid()):
            p = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "serve"],
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            (data() / "daemon.pid").write_text(str(p.pid))
        doc = {"ok": True}
    elif name in ("ready", "status"):
        pid = _daemon_pid()
        running = _alive(pid)
        doc = {"running": running,
               "ready": running and (data() / "probes-service.json").exists()}
    elif name == "stop":
        pid = _daemon_pid()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
        (data() / "daemon.pid").unlink(missing_ok=True)
        doc = {"ok": True}
    else:
        print(f"unknown op {name}", file=sys.stderr)
        return 2
    print(json.dumps(doc), flush=True)
    return 0


def serve() -> int:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    write_json(data() / "probes-service.json", probes_here_and_in_child())
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "run":
        sys.exit(run_runner(sys.argv[2:]))
    if cmd == "probe":
        print(json.dumps({**probes(), **walls()}))
        sys.exit(0)
    if cmd == "serve":
        sys.exit(serve())
    sys.exit(op(cmd))
