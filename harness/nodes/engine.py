"""A Docker engine for the container backend, and a client for it.

Uses a running engine when there is one (DOCKER_HOST, the default socket, or the harness's own
socket from an earlier run still up). Otherwise it starts `dockerd` itself, as root, with no
bridge and no iptables (every node runs with `--network none`; the harness must not touch the
machine's firewall), its own data root, exec root and socket under the harness cache dir, and
the last harness run using it stops it again (several runs at once share one engine: each holds
a shared lock on ``users.lock`` while it uses it; whoever can take it exclusively at its end is
the last). The data root survives, so imported images are cached between runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.nodes.cache import cache_dir

__all__ = ["Engine", "EngineUnavailable", "engine_available", "start_engine"]


# dockerd processes we started that other runs still use (Engine.close)
_LEFT_RUNNING: list[subprocess.Popen[bytes]] = []


class EngineUnavailable(RuntimeError):
    """No engine is running and none can be started here (not root, no dockerd...)."""


@dataclass
class Engine:
    client: Any  # docker.DockerClient
    url: str
    started_by_us: bool
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    # The harness's own engine: our shared hold on users.lock while we use it (None for an
    # engine somebody else runs, e.g. the system's: never stopped by us).
    users: Any = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        """Stop the harness's own dockerd if no other harness run still uses it (SIGTERM,
        then SIGKILL after 30 s)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.client.close()
        if self.users is None:
            return
        import fcntl

        d = _engine_dir()
        with open(d / "start.lock", "w") as lock:  # no run starts or joins it meanwhile
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.users.close()  # our shared hold ends
            with open(d / "users.lock", "w") as users:
                try:
                    fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    # Another run still uses it: the last one stops it. Our dockerd child is
                    # kept referenced, so that no Popen.__del__ warns it is still running.
                    if self.proc is not None:
                        _LEFT_RUNNING.append(self.proc)
                    return
                self._stop_dockerd(d)

    def _stop_dockerd(self, d: Path) -> None:
        if self.proc is not None:  # ours: wait for our child
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(10)
            return
        try:  # started by a run that has ended: its pid file says which
            pid = int((d / "dockerd.pid").read_text().strip())
            os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            return
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _engine_dir() -> Path:
    d = cache_dir() / "docker"
    d.mkdir(exist_ok=True)
    return d


def _own_socket() -> Path:
    return _engine_dir() / "docker.sock"


def _answers(url: str) -> bool:
    """Whether something accepts connections at a unix:// URL. Checked with a plain socket
    first because the docker SDK leaks its socket when the connect fails."""
    if not url.startswith("unix://"):
        return True  # tcp:// and others: let the SDK try
    path = url[len("unix://"):]
    if not os.path.exists(path):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def _try(url: str) -> Any | None:
    import docker

    if not _answers(url):
        return None
    client = None
    try:
        client = docker.DockerClient(base_url=url, timeout=120)
        client.ping()
        return client
    except Exception:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        return None


def _candidates() -> list[str]:
    out = []
    if os.environ.get("DOCKER_HOST"):
        out.append(os.environ["DOCKER_HOST"])
    out.append("unix:///var/run/docker.sock")
    out.append(f"unix://{_own_socket()}")
    return out


def engine_available() -> str | None:
    """Why the container backend cannot run here, or None when it can."""
    try:
        import docker  # noqa: F401
    except ImportError:
        return "the docker SDK for Python is not installed (pip install docker)"
    if sys.platform != "linux":
        return "the container backend needs Linux"
    for url in _candidates():
        client = _try(url)
        if client is not None:
            client.close()
            return None
    if shutil.which("dockerd") is None:
        return "no Docker engine is running and dockerd is not installed"
    if os.geteuid() != 0:
        return "no Docker engine is running and starting dockerd needs root"
    return None


def start_engine(timeout_s: float = 60.0) -> Engine:
    """A client for a running engine, starting the harness's own dockerd if needed."""
    reason = engine_available()
    if reason:
        raise EngineUnavailable(reason)
    own = f"unix://{_own_socket()}"
    for url in _candidates():
        if url == own:
            continue  # joined below, under the lock, as one of its users
        client = _try(url)
        if client is not None:
            return Engine(client, url, started_by_us=False)
    import fcntl  # POSIX only, like the rest of the container backend

    d = _engine_dir()
    # One harness at a time may start, join or stop the engine on this data root.
    with open(d / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        users = open(d / "users.lock", "w")  # noqa: SIM115 - held past this block: Engine.close
        fcntl.flock(users, fcntl.LOCK_SH)
        try:
            return _join_or_start(d, own, users, timeout_s)
        except BaseException:
            users.close()
            raise


def _join_or_start(d: Path, url: str, users: Any, timeout_s: float = 60.0) -> Engine:
    """Under start.lock: a client for the harness's own engine, started if none answers."""
    client = _try(url)
    if client is not None:
        return Engine(client, url, started_by_us=False, users=users)
    # Short exec root (containerd's socket paths must stay under the unix path limit),
    # one per cache dir so that two caches never share an engine's runtime state.
    tag = hashlib.sha256(str(d).encode()).hexdigest()[:8]
    exec_root = Path(f"/run/oarbank-harness-docker-{tag}") if os.access("/run", os.W_OK) \
        else d / "exec"
    for stale in (_own_socket(), d / "dockerd.pid"):
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    log = d / "dockerd.log"
    argv = [
        "dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false",
        "--ip-masq=false", f"--data-root={d / 'data'}", f"--exec-root={exec_root}",
        f"--pidfile={d / 'dockerd.pid'}", "-H", url,
    ]
    # Its own temporary folder: the engine may outlive the harness run that started it
    # (others reuse it), so it must not inherit a TMPDIR that run removes at its end (runc
    # puts each exec's process file there).
    tmp = d / "tmp"
    tmp.mkdir(exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(os.environ, TMPDIR=str(tmp)))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:]
            raise EngineUnavailable(f"dockerd exited with {proc.returncode}; {log}:\n{tail}")
        if _own_socket().exists():
            client = _try(url)
            if client is not None:
                return Engine(client, url, started_by_us=True, proc=proc, log=log,
                              users=users)
        time.sleep(0.2)
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(20)
    raise EngineUnavailable(f"dockerd did not answer within {timeout_s:.0f}s; see {log}")
