"""A test module (runner AND service) that tries every operation the sandbox must refuse.

Each operation is tried for real and recorded as "ok" (it worked) or the errno name it failed
with ("EPERM", ...), in-process ("self") and from a process it starts ("child": a grandchild
of the agent for the runner, a great-grandchild for the service daemon). Standard library only.

Targets come from the node settings (OARBANK_SETTINGS_FILE), set up by the test OUTSIDE the
sandbox: {"tcp4": port on 127.0.0.1, "tcp6": port on ::1 or null, "unix_path": a listening
unix socket's path}.

    sandbox_probe.py run --spec S --workdir W --out R    runner: probes -> result.json
    sandbox_probe.py probe                               print the probes as one JSON line
    sandbox_probe.py <op>                                service ops (fingerprint, start, ...)
    sandbox_probe.py serve                               the service daemon
"""

from __future__ import annotations

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


def probes_here_and_in_child() -> dict[str, dict[str, str]]:
    child = subprocess.run([sys.executable, "-I", os.path.abspath(__file__), "probe"],
                           capture_output=True, text=True, timeout=60, check=False)
    try:
        in_child = json.loads(child.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        in_child = {"error": f"child exited {child.returncode}: {child.stderr[-500:]}"}
    return {"self": probes(), "child": in_child}


def write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def run_runner(args: list[str]) -> int:
    spec = json.loads(Path(args[args.index("--spec") + 1]).read_text())
    out = Path(args[args.index("--out") + 1])
    payload = spec.get("payload", {})
    (data() / f"ran-{spec['attempt_id']}").write_text(str(os.getpid()))
    if "exit" in payload:  # the runner's OWN exit code (e.g. 70, which is not the launcher's)
        return int(payload["exit"])
    result = {"probes": probes_here_and_in_child(), "pid": os.getpid()}
    write_json(data() / f"probes-runner-{spec['attempt_id']}.json", result)
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
        write_json(data() / "probes-op-start.json", probes())
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
        print(json.dumps(probes()))
        sys.exit(0)
    if cmd == "serve":
        sys.exit(serve())
    sys.exit(op(cmd))
