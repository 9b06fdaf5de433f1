"""A Docker engine for the container backend, and a client for it.

Uses a running engine when there is one (DOCKER_HOST, the default socket, or the harness's own
socket from an earlier run still up). Otherwise it starts `dockerd` itself, as root, with no
bridge and no iptables (every node runs with `--network none`; the harness must not touch the
machine's firewall), its own data root, exec root and socket under the harness cache dir, and
stops it again at the end. The data root survives, so imported images are cached between runs.
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

from harness.cache import cache_dir

__all__ = ["Engine", "EngineUnavailable", "engine_available", "start_engine"]


class EngineUnavailable(RuntimeError):
    """No engine is running and none can be started here (not root, no dockerd...)."""


@dataclass
class Engine:
    client: Any  # docker.DockerClient
    url: str
    started_by_us: bool
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        """Stop dockerd if this harness started it (SIGTERM, then SIGKILL after 30 s)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self.client.close()
        if self.started_by_us and self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


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
    for url in _candidates():
        client = _try(url)
        if client is not None:
            return Engine(client, url, started_by_us=False)
    import fcntl  # POSIX only, like the rest of the container backend

    d = _engine_dir()
    # One harness at a time may start the engine on this data root.
    with open(d / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        url = f"unix://{_own_socket()}"
        client = _try(url)
        if client is not None:
            return Engine(client, url, started_by_us=False)
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
                    return Engine(client, url, started_by_us=True, proc=proc, log=log)
            time.sleep(0.2)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(20)
        raise EngineUnavailable(f"dockerd did not answer within {timeout_s:.0f}s; see {log}")
