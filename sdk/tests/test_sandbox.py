"""The sandbox launcher, for real: real launcher, real children and grandchildren, real sockets.

Every escape attempt runs inside ``wrap([...])`` and must fail with EPERM/EACCES at the named
operation; the same script run WITHOUT the sandbox must get through (or fail differently), so
each assertion is one that could fail.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sandbox_helpers import TIMEOUT_S
from sandbox_helpers import run_in_own_group as _run

from oarbank_sdk import sandbox
from oarbank_sdk.sandbox import _policy

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux sandbox")

REFUSED = (errno.EPERM, errno.EACCES)

# Runs inside the sandbox (and, as a control, outside it). Prints one JSON object: for each
# scenario the operation that failed and its errno ({"op": null} = everything succeeded), plus
# what /proc says about this process; with "grandchild" set it also runs itself as a child.
ATTEMPTS = textwrap.dedent(
    r"""
    import ctypes, errno, json, os, socket, subprocess, sys

    cfg = json.loads(sys.argv[1])

    class Refused(Exception):
        pass

    def step(op, fn, *args):
        try:
            return fn(*args)
        except OSError as exc:
            raise Refused(op, exc.errno)

    def held(name):
        return socket.socket(fileno=os.dup(cfg[name]))

    def tcp_listen_127():
        s = step("socket", socket.socket, socket.AF_INET, socket.SOCK_STREAM)
        step("bind", s.bind, ("127.0.0.1", 0))
        step("listen", s.listen, 1)

    def udp_bind_127():
        s = step("socket", socket.socket, socket.AF_INET, socket.SOCK_DGRAM)
        step("bind", s.bind, ("127.0.0.1", 0))

    def unix_path_listen():
        s = step("socket", socket.socket, socket.AF_UNIX, socket.SOCK_STREAM)
        step("bind", s.bind, cfg["listen_path"])
        step("listen", s.listen, 1)

    def unix_abstract_listen():
        s = step("socket", socket.socket, socket.AF_UNIX, socket.SOCK_STREAM)
        step("bind", s.bind, "\0" + cfg["abstract_name"])
        step("listen", s.listen, 1)

    def connect_127():
        s = step("socket", socket.socket, socket.AF_INET, socket.SOCK_STREAM)
        step("connect", s.connect, ("127.0.0.1", cfg["tcp_port"]))

    def connect_v6_loopback():
        s = step("socket", socket.socket, socket.AF_INET6, socket.SOCK_STREAM)
        step("connect", s.connect, ("::1", cfg["tcp6_port"]))

    def connect_unix_outside():
        s = step("socket", socket.socket, socket.AF_UNIX, socket.SOCK_STREAM)
        step("connect", s.connect, cfg["outside_path"])

    def socket_packet():
        step("socket", socket.socket, socket.AF_PACKET, socket.SOCK_RAW)

    def socket_netlink():
        step("socket", socket.socket, socket.AF_NETLINK, socket.SOCK_RAW)

    # Sockets created OUTSIDE and passed in: the filter must still refuse naming them,
    # listening on them, or connecting them.
    def held_inet_bind():
        step("bind", held("held_inet").bind, ("127.0.0.1", 0))

    def held_unix_listen():
        step("listen", held("held_unix_a").listen, 1)

    def held_unix_bind_abstract():
        step("bind", held("held_unix_a").bind, "\0" + cfg["abstract_name"] + "-held")

    def held_unix_connect_outside():
        step("connect", held("held_unix_b").connect, cfg["outside_path"])

    def socketpair_listen():
        a, b = socket.socketpair()
        step("listen", a.listen, 1)

    def io_uring():
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        fd = libc.syscall(ctypes.c_long(425), ctypes.c_uint(1), ctypes.c_void_p(None))
        if fd < 0:
            raise Refused("io_uring_setup", ctypes.get_errno())
        os.close(fd)

    results = {}
    for fn in (tcp_listen_127, udp_bind_127, unix_path_listen, unix_abstract_listen, connect_127,
               connect_v6_loopback, connect_unix_outside, socket_packet, socket_netlink,
               held_inet_bind, held_unix_listen, held_unix_bind_abstract,
               held_unix_connect_outside, socketpair_listen, io_uring):
        try:
            fn()
        except Refused as r:
            results[fn.__name__] = {"op": r.args[0], "errno": r.args[1]}
        else:
            results[fn.__name__] = {"op": None, "errno": None}

    a, b = socket.socketpair()
    a.sendall(b"ping")
    b.sendall(b"pong")
    socketpair_ok = b.recv(4) == b"ping" and a.recv(4) == b"pong"

    status = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        status[key] = value.strip()
    out = {
        "pid": os.getpid(),
        "results": results,
        "socketpair": socketpair_ok,
        "NoNewPrivs": status["NoNewPrivs"],
        "Seccomp": status["Seccomp"],
        "netns": os.readlink("/proc/self/ns/net"),
    }
    if cfg.get("grandchild"):
        sub = dict(cfg, grandchild=False)
        fds = (cfg["held_inet"], cfg["held_unix_a"], cfg["held_unix_b"])
        done = subprocess.run([sys.executable, "-I", __file__, json.dumps(sub)], pass_fds=fds,
                              capture_output=True, text=True, timeout=60)
        out["grandchild"] = json.loads(done.stdout) if done.returncode == 0 else done.stderr
    print(json.dumps(out))
    """
)

# scenario -> the operation the sandbox must refuse
EXPECTED_REFUSAL = {
    "tcp_listen_127": "socket",
    "udp_bind_127": "socket",
    "unix_path_listen": "socket",
    "unix_abstract_listen": "socket",
    "connect_127": "socket",
    "connect_v6_loopback": "socket",
    "connect_unix_outside": "socket",
    "socket_packet": "socket",
    "socket_netlink": "socket",
    "held_inet_bind": "bind",
    "held_unix_listen": "listen",
    "held_unix_bind_abstract": "bind",
    "held_unix_connect_outside": "connect",
    "socketpair_listen": "listen",
    "io_uring": "io_uring_setup",
}


@pytest.fixture
def targets(tmp_path: Path):
    """Real things to reach from inside: loopback TCP listeners (v4 and v6) and a unix socket
    listening in a tmp folder, plus unbound sockets to pass in."""
    opened: list[socket.socket] = []

    def keep(s: socket.socket) -> socket.socket:
        opened.append(s)
        return s

    tcp = keep(socket.create_server(("127.0.0.1", 0)))
    tcp6 = keep(socket.create_server(("::1", 0), family=socket.AF_INET6))
    outside_path = str(tmp_path / "outside.sock")
    unix = keep(socket.socket(socket.AF_UNIX))
    unix.bind(outside_path)
    unix.listen(4)
    held_inet = keep(socket.socket(socket.AF_INET))
    held_unix_a = keep(socket.socket(socket.AF_UNIX))
    held_unix_b = keep(socket.socket(socket.AF_UNIX))
    for s in (held_inet, held_unix_a, held_unix_b):
        s.set_inheritable(True)
    cfg = {
        "tcp_port": tcp.getsockname()[1],
        "tcp6_port": tcp6.getsockname()[1],
        "outside_path": outside_path,
        "listen_path": str(tmp_path / "inside.sock"),
        "abstract_name": f"oarbank-test-{os.getpid()}-{tmp_path.name}",
        "held_inet": held_inet.fileno(),
        "held_unix_a": held_unix_a.fileno(),
        "held_unix_b": held_unix_b.fileno(),
        "grandchild": True,
    }
    script = tmp_path / "attempts.py"
    script.write_text(ATTEMPTS)
    try:
        yield cfg, script, {"tcp": tcp, "tcp6": tcp6, "unix": unix}
    finally:
        for s in opened:
            s.close()


def _attempt(cfg: dict, script: Path, confined: bool) -> dict:
    argv = [sys.executable, "-I", str(script), json.dumps(cfg)]
    fds = (cfg["held_inet"], cfg["held_unix_a"], cfg["held_unix_b"])
    done = _run(sandbox.wrap(argv, read=[script.parent]) if confined else argv, pass_fds=fds)
    assert done.returncode == 0, f"attempt script failed: rc={done.returncode} {done.stderr}"
    return json.loads(done.stdout)


def _assert_refused(report: dict, who: str) -> None:
    assert report["NoNewPrivs"] == "1", f"{who}: no_new_privs not set"
    assert report["Seccomp"] == "2", f"{who}: no seccomp filter"
    for scenario, op in EXPECTED_REFUSAL.items():
        got = report["results"][scenario]
        assert got["op"] is not None, f"{who}: {scenario} was NOT refused: every step succeeded"
        assert got["op"] == op, f"{who}: {scenario}: expected {op}() refused, but {got['op']}() failed"
        assert got["errno"] in REFUSED, (
            f"{who}: {scenario}: {op}() failed with {errno.errorcode.get(got['errno'])}, not EPERM/EACCES"
        )
    assert report["socketpair"], f"{who}: socketpair() must keep working"


def test_every_escape_is_refused_in_child_and_grandchild(targets) -> None:
    cfg, script, servers = targets
    report = _attempt(cfg, script, confined=True)
    _assert_refused(report, "child")
    grandchild = report["grandchild"]
    assert isinstance(grandchild, dict), f"grandchild did not report: {grandchild}"
    _assert_refused(grandchild, "grandchild")
    assert grandchild["pid"] != report["pid"]
    # Own network namespace (root can unshare here), inherited by the grandchild.
    assert report["netns"] != os.readlink("/proc/self/ns/net")
    assert grandchild["netns"] == report["netns"]
    # Nothing got through to the outside listeners, and no socket file was created.
    for name, server in servers.items():
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()
        server.setblocking(True)
        assert name  # which listener is in the traceback if accept() succeeded
    assert not Path(cfg["listen_path"]).exists()


def test_same_script_gets_through_without_the_sandbox(targets) -> None:
    """Control: unconfined, none of the scenarios is refused with EPERM/EACCES, so the
    refusals above are the sandbox's doing."""
    cfg, script, servers = targets
    report = _attempt(dict(cfg, grandchild=False), script, confined=False)
    assert report["Seccomp"] == "0"
    refused = {scenario: got for scenario, got in report["results"].items()
               if got["errno"] in REFUSED}
    # An ordinary user's AF_PACKET socket needs CAP_NET_RAW: the kernel refuses it unconfined
    # too, so for that user it shows nothing about the sandbox.
    kernel_refuses = set() if os.geteuid() == 0 else {"socket_packet"}
    assert set(refused) <= kernel_refuses, f"unconfined, refused: {refused}"
    assert report["results"]["tcp_listen_127"]["op"] is None
    assert report["results"]["connect_unix_outside"]["op"] is None
    for server in servers.values():  # drain what the control connected
        server.settimeout(5)
    servers["tcp"].accept()[0].close()
    servers["unix"].accept()[0].close()


def test_python_isolated_mode_starts_under_the_filter() -> None:
    done = _run(sandbox.wrap([sys.executable, "-I", "-c", "import sys, json, ssl; print('started')"]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "started"
    assert done.stderr == ""


def test_launcher_execs_in_place_and_passes_exit_status_through() -> None:
    code = "import os, sys; print(os.getpid(), sorted(os.listdir('/proc/self/fd'))); sys.exit(3)"
    proc = subprocess.Popen(
        sandbox.wrap([sys.executable, "-I", "-c", code]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 3, err
    pid, fds = out.split(" ", 1)
    assert int(pid) == proc.pid, "the child must have the launcher's pid (same process group)"
    # 0, 1, 2 and the listdir's own descriptor: the launcher leaks nothing into the child.
    assert len(eval(fds)) == 4, f"unexpected descriptors in the child: {fds}"



def test_child_gets_exactly_the_callers_environment() -> None:
    # The launcher's interpreter coerces a C locale (adds LC_CTYPE to os.environ); the child
    # must still see exactly what the caller passed (the agent's environments are exact).
    env = {"PATH": "/usr/bin:/bin", "ONLY": "this"}
    done = subprocess.run(sandbox.wrap(["cat", "/proc/self/environ"]), env=env,
                          capture_output=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    got = dict(item.split(b"=", 1) for item in done.stdout.split(b"\0") if item)
    assert got == {b"PATH": b"/usr/bin:/bin", b"ONLY": b"this"}

@pytest.mark.parametrize("fault", ["nnp", "seccomp", "verify", "no-such-fault"])
def test_setup_failure_refuses_to_run_the_child(tmp_path: Path, fault: str) -> None:
    marker = tmp_path / "child-ran"
    code = f"open({str(marker)!r}, 'w').close()"
    env = dict(os.environ, **{sandbox.FAULT_ENV: fault})
    done = _run(sandbox.wrap([sys.executable, "-I", "-c", code], write=[tmp_path]), env=env)
    assert done.returncode == sandbox.EXIT_SETUP_FAILED == 70
    assert not marker.exists(), "the child ran although setup failed"
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("oarbank-sandbox: setup failed:")
    assert "unconfined" in lines[0]
    if fault == "verify":  # the filter was skipped: /proc/self/status exposed it
        assert "Seccomp is '0'" in lines[0]


def test_without_fault_the_same_child_runs(tmp_path: Path) -> None:
    """Control for the refusal test: the marker IS written when setup succeeds."""
    marker = tmp_path / "child-ran"
    done = _run(sandbox.wrap([sys.executable, "-I", "-c", f"open({str(marker)!r}, 'w').close()"],
                             write=[tmp_path]))
    assert done.returncode == 0, done.stderr
    assert marker.exists()


@pytest.mark.parametrize(
    "args, reason",
    [
        (["--net", "host", "--", "true"], "unsupported --net 'host'"),
        (["true"], "missing '--'"),
        (["--"], "no command given"),
        (["--bogus", "--", "true"], "unknown argument '--bogus'"),
    ],
)
def test_bad_launcher_arguments_are_a_setup_failure(args: list[str], reason: str) -> None:
    done = _run([sys.executable, "-I", "-m", "oarbank_sdk.sandbox.launch", *args])
    assert done.returncode == 70
    assert reason in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_exec_failure_exits_71(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-program"
    done = _run(sandbox.wrap([str(missing)], read=[tmp_path]))
    assert done.returncode == sandbox.EXIT_EXEC_FAILED == 71
    assert done.stderr.startswith("oarbank-sandbox: exec failed:")
    assert "No such file or directory" in done.stderr
    not_exec = tmp_path / "not-executable"
    not_exec.write_text("#!/bin/sh\n")
    done = _run(sandbox.wrap([str(not_exec)], read=[tmp_path]))
    assert done.returncode == 71
    assert "Permission denied" in done.stderr


def test_capabilities_are_enforced_here() -> None:
    caps = sandbox.capabilities(refresh=True)
    assert set(caps) == set(sandbox.CAPABILITY_NAMES)
    assert caps.pop("macos_seatbelt") == "unavailable"
    assert caps == dict.fromkeys(caps, "enforced"), caps
    assert sandbox.available()


def test_capabilities_say_unavailable_when_the_launcher_cannot_confine(monkeypatch) -> None:
    monkeypatch.setenv(sandbox.FAULT_ENV, "seccomp")
    try:
        caps = sandbox.capabilities(refresh=True)
        assert caps == dict.fromkeys(sandbox.CAPABILITY_NAMES, "unavailable")
        assert not sandbox.available()
    finally:
        monkeypatch.delenv(sandbox.FAULT_ENV)
        sandbox.capabilities(refresh=True)


def test_probe_run_unconfined_reports_nothing_enforced() -> None:
    """The probe really tests: outside the launcher it finds nothing refused."""
    done = _run([sys.executable, "-I", "-m", "oarbank_sdk.sandbox._probe", os.readlink("/proc/self/ns/net")])
    assert done.returncode == 0, done.stderr
    caps = _policy.derive_capabilities(json.loads(done.stdout), "linux")
    expected = dict.fromkeys(sandbox.CAPABILITY_NAMES, "unavailable")
    if os.geteuid() != 0:
        expected["caps_dropped"] = "enforced"  # an ordinary user holds no capabilities to drop
    assert caps == expected


def test_module_form_of_the_launcher_runs_a_confined_child() -> None:
    code = "print(open('/proc/self/status').read().count('Seccomp:\\t2'))"
    launch = [sys.executable, "-I", "-m", "oarbank_sdk.sandbox.launch", "--net", "none", "--"]
    done = _run([*launch, sys.executable, "-I", "-c", code])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"


def test_service_endpoint_does_not_import_the_sandbox() -> None:
    code = (
        "import sys, oarbank_sdk.service_endpoint; "
        "print(sorted(m for m in sys.modules if m == 'pyseccomp' or m.startswith('oarbank_sdk.sandbox')))"
    )
    done = _run([sys.executable, "-I", "-c", code])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --- the walls beyond the network (Landlock, capabilities, process and privileged syscalls) ---

WALLS_SCRIPT = textwrap.dedent(
    r"""
    import ctypes, errno, json, os, signal, subprocess, sys

    cfg = json.loads(sys.argv[1])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    NR = {"x86_64": {"ptrace": 101, "mount": 165, "unshare": 272, "bpf": 321, "clone": 56,
                     "process_vm_readv": 310, "kcmp": 312, "keyctl": 250,
                     "perf_event_open": 298, "userfaultfd": 323, "init_module": 175},
          "aarch64": {"ptrace": 117, "mount": 40, "unshare": 97, "bpf": 280, "clone": 220,
                      "process_vm_readv": 270, "kcmp": 272, "keyctl": 219,
                      "perf_event_open": 241, "userfaultfd": 282, "init_module": 105}}[os.uname().machine]

    def sys_(name, *args):
        nr = NR[name] if isinstance(name, str) else name
        if libc.syscall(ctypes.c_long(nr), *(ctypes.c_long(a) for a in args)) < 0:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e))

    def create(path):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))

    def tryit(fn):
        try:
            fn()
        except OSError as exc:
            return errno.errorcode.get(exc.errno, str(exc.errno))
        return "ok"

    me = os.getpid()
    r = {
        "write_granted": tryit(lambda: create(os.path.join(cfg["write"], f"ok-{me}"))),
        "write_readonly": tryit(lambda: create(os.path.join(cfg["read"], f"hostile-{me}"))),
        "append_readonly": tryit(lambda: open(os.path.join(cfg["read"], "code.py"), "a").close()),
        "write_outside": tryit(lambda: create(os.path.join(cfg["outside"], f"hostile-{me}"))),
        "read_outside": tryit(lambda: open(os.path.join(cfg["outside"], "secret")).read()),
        "list_outside": tryit(lambda: os.listdir(cfg["outside"])),
        "read_granted": tryit(lambda: open(os.path.join(cfg["read"], "code.py")).read()),
        "etc_shadow": tryit(lambda: open("/etc/shadow").read()),
        "list_root": tryit(lambda: os.listdir("/")),
        "dev_null": tryit(lambda: open("/dev/null", "w").write("x")),
        "dev_ptmx": tryit(lambda: os.close(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))),
        "list_dev": tryit(lambda: os.listdir("/dev")),
        "kill_parent": tryit(lambda: os.kill(cfg["parent"], 0)),
        "kill_guarded": tryit(lambda: os.kill(cfg["guarded"], 0)),
        "kill_all": tryit(lambda: os.kill(-1, 0)),
        "environ_parent": tryit(lambda: open(f"/proc/{cfg['parent']}/environ", "rb").read()),
        "process_vm_readv": tryit(lambda: sys_("process_vm_readv", me, 0, 0, 0, 0, 0)),
        "kcmp": tryit(lambda: sys_("kcmp", me, me, 0, 0, 0)),
        "clone3": tryit(lambda: sys_(435, 0, 0)),
        "bpf": tryit(lambda: sys_("bpf", 0, 0, 0)),
        "keyctl": tryit(lambda: sys_("keyctl", 0, 0, 0, 0, 0)),
        "perf_event_open": tryit(lambda: sys_("perf_event_open", 0, 0, -1, -1, 0)),
        "userfaultfd": tryit(lambda: sys_("userfaultfd", 0)),
        "thread_starts": tryit(lambda: __import__("threading").Thread(target=lambda: None).start()),
        "fork_starts": tryit(lambda: subprocess.run(["true"], check=True)),
    }
    if not cfg.get("control"):
        # Only inside the sandbox: unconfined (as root) these would really attach to the test,
        # mount, fork a process in a new pid namespace, unshare, load a module.
        r.update({
            "ptrace_attach": tryit(lambda: sys_("ptrace", 16, cfg["parent"], 0, 0)),
            "mount": tryit(lambda: sys_("mount", 0, 0, 0, 0, 0)),
            "unshare_user": tryit(lambda: sys_("unshare", 0x10000000)),
            "clone_newpid": tryit(lambda: sys_("clone", 0x20000000 | 17, 0, 0, 0, 0)),
            "init_module": tryit(lambda: sys_("init_module", 0, 0, 0)),
        })
    status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
    out = {"results": r, "caps": {k: status[k].strip() for k in status if k.startswith("Cap")}}
    if cfg.get("grandchild"):
        sub = dict(cfg, grandchild=False)
        done = subprocess.run([sys.executable, "-I", __file__, json.dumps(sub)],
                              capture_output=True, text=True, timeout=60)
        out["grandchild"] = json.loads(done.stdout) if done.returncode == 0 else done.stderr
    print(json.dumps(out))
    """
)

# attempt -> what the kernel answers inside the sandbox (Landlock: EACCES; seccomp and the
# signal scope: EPERM; clone3: ENOSYS, so the C library falls back to the filtered clone).
WALLS_EXPECTED = {
    "write_granted": "ok", "read_granted": "ok", "dev_null": "ok",
    "thread_starts": "ok", "fork_starts": "ok",
    "write_readonly": "EACCES", "append_readonly": "EACCES", "write_outside": "EACCES",
    "read_outside": "EACCES", "list_outside": "EACCES", "etc_shadow": "EACCES",
    "list_root": "EACCES", "dev_ptmx": "EACCES", "list_dev": "EACCES",
    "kill_parent": "EPERM", "kill_guarded": "EPERM", "kill_all": "EPERM",
    "environ_parent": "EACCES", "ptrace_attach": "EPERM", "process_vm_readv": "EPERM",
    "kcmp": "EPERM", "mount": "EPERM", "unshare_user": "EPERM", "clone_newpid": "EPERM",
    "clone3": "ENOSYS", "bpf": "EPERM", "keyctl": "EPERM", "perf_event_open": "EPERM",
    "userfaultfd": "EPERM", "init_module": "EPERM",
}


@pytest.fixture
def walls_setup(tmp_path: Path):
    read, write, outside = tmp_path / "bundle", tmp_path / "work", tmp_path / "state"
    for d in (read, write, outside):
        d.mkdir()
    (read / "code.py").write_text("# the bundle\n")
    (read / "walls.py").write_text(WALLS_SCRIPT)
    (outside / "secret").write_text("agent state\n")
    guarded = subprocess.Popen(["sleep", "60"], start_new_session=True)  # stands for the agent
    cfg = {"read": str(read), "write": str(write), "outside": str(outside),
           "parent": os.getpid(), "guarded": guarded.pid, "grandchild": True}
    try:
        yield cfg, read, write, outside
    finally:
        guarded.kill()
        guarded.wait()


def _walls(cfg: dict, argv_prefix: list[str] | None, **wrap_kw) -> dict:
    argv = [sys.executable, "-I", os.path.join(cfg["read"], "walls.py"), json.dumps(cfg)]
    full = sandbox.wrap(argv, **wrap_kw) if argv_prefix is None else argv
    done = _run(full)
    assert done.returncode == 0, f"walls script failed: rc={done.returncode} {done.stderr}"
    return json.loads(done.stdout)


def _digest(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_wall_holds_in_child_and_grandchild(walls_setup) -> None:
    cfg, read, write, outside = walls_setup
    before = (_digest(read), _digest(outside))
    report = _walls(cfg, None, read=[read], write=[write], guard_pids=[cfg["guarded"]])
    for who, rep in (("child", report), ("grandchild", report["grandchild"])):
        assert isinstance(rep, dict), f"{who} did not report: {rep}"
        wrong = {k: (rep["results"].get(k), want) for k, want in WALLS_EXPECTED.items()
                 if rep["results"].get(k) != want}
        assert not wrong, f"{who}: (got, expected): {wrong}"
        assert set(rep["caps"].values()) == {"0000000000000000"}, f"{who}: {rep['caps']}"
    assert (_digest(read), _digest(outside)) == before, "the read-only or outside folder changed"
    assert sorted(p.name.split("-")[0] for p in write.iterdir()) == ["ok", "ok"]


def test_the_same_attempts_get_through_without_the_sandbox(walls_setup) -> None:
    """Control: unconfined the attempts are not refused with those errnos (but what the kernel
    keeps from an ordinary user), so the refusals above are the sandbox's doing. Only the
    harmless ones are compared."""
    cfg, read, write, outside = walls_setup
    report = _walls(dict(cfg, grandchild=False, control=True), [])
    r = report["results"]
    for k in ("write_readonly", "append_readonly", "write_outside", "read_outside",
              "list_outside", "list_root", "dev_ptmx", "list_dev", "kill_parent",
              "kill_guarded", "environ_parent"):
        assert r[k] == "ok", f"unconfined {k}: {r[k]}"
    refused = {k: r[k] for k in ("process_vm_readv", "kcmp", "clone3", "bpf", "keyctl",
                                 "perf_event_open", "userfaultfd") if r[k] in ("EPERM", "EACCES")}
    # vm.unprivileged_userfaultfd = 0 leaves userfaultfd to privileged users, unconfined too.
    kernel_refuses = set()
    if os.geteuid() != 0 and Path("/proc/sys/vm/unprivileged_userfaultfd").read_text().strip() == "0":
        kernel_refuses.add("userfaultfd")
    assert set(refused) <= kernel_refuses, f"unconfined, refused: {refused}"


def test_dev_option_grants_a_device_node_and_signals_open_drops_the_scope(walls_setup) -> None:
    cfg, read, write, _ = walls_setup
    cfg = dict(cfg, grandchild=False)
    rep = _walls(cfg, None, read=[read], write=[write], signals="open")["results"]
    assert rep["kill_parent"] == "ok"  # no scope: a same-user process outside can be signalled
    assert rep["kill_all"] == "EPERM"  # kill(-1) stays refused
    assert rep["dev_ptmx"] == "EACCES"
    # --dev is how the GPU nodes are granted ([sandbox].devices.gpu = "compute"): the same
    # rule on another character device, since this machine may have no GPU.
    argv = [sys.executable, "-I", os.path.join(cfg["read"], "walls.py"), json.dumps(cfg)]
    full = sandbox.wrap(argv, read=[read], write=[write])
    i = full.index("--")
    done = _run([*full[:i], "--dev", "/dev/ptmx", *full[i:]])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["results"]["dev_ptmx"] == "ok"


def test_gpu_devices_are_the_gpu_nodes_present() -> None:
    nodes = sandbox.gpu_devices()
    assert all(n.startswith(("/dev/nvidia", "/dev/dri", "/dev/kfd")) for n in nodes), nodes
    argv = sandbox.launcher_argv(gpu=True)
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--dev"] == nodes


@pytest.mark.parametrize("args, reason", [
    (["--read", "relative/path", "--", "true"], "needs an absolute path"),
    (["--signals", "loose", "--", "true"], "unsupported --signals 'loose'"),
    (["--guard-pid", "abc", "--", "true"], "--guard-pid needs a process id"),
])
def test_bad_wall_arguments_are_a_setup_failure(args: list[str], reason: str) -> None:
    done = _run([sys.executable, "-I", "-m", "oarbank_sdk.sandbox.launch", *args])
    assert done.returncode == 70
    assert reason in done.stderr
