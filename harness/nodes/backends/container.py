"""The `container` backend: each node is a Docker container with `--network none` running
the agent, one image per Debian release (bookworm, trixie).

The portal runs on the host; its socket's folder is bind-mounted into every container at
/portal, and the node's own folder at /node (state dir, modules, settings, agent.log), so the
harness reads the node's files from the host. The agent runs as a `docker exec` of
`oarbank-agent run` (so `kill -9` of the agent leaves the container and its orphans for the
next agent to deal with, as on a real machine); PID 1 is a small reaper so orphans that die
do not linger as zombies.

A node's processes are listed from inside its container, so their pids are the ones the node
itself uses (what its agent, its jobs' results and its services' files say): `docker top`
would give the host's pids for the same processes, and a pid a job reported would never be
found among them.
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.nodes.backends.base import Backend, CliResult, Node, NodeError, copy_modules
from harness.nodes.engine import Engine, engine_available, start_engine
from harness.nodes.procs import ProcInfo

LIST_TRIES = 5  # the in-container process listing, before a failure is one

__all__ = ["ContainerBackend", "ContainerNode", "LABEL"]

LABEL = "dev.oarbank.harness.run"

# PID 1 of every node: reap orphans, exit on SIGTERM/SIGINT. Signals are blocked and taken
# with sigwaitinfo, so no SIGCHLD is lost between a waitpid and the wait.
INIT = """
import os, signal, sys
sigs = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}
signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
while True:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    if signal.sigwaitinfo(sigs).si_signo != signal.SIGCHLD:
        sys.exit(0)
"""

# Run in the container: every live process but PID 1 and this lister, as JSON [pid, pgid,
# cmdline], from /proc (the image has no ps). A process that ends while it is read is left out.
LIST = """
import json, os
out = []
for name in os.listdir('/proc'):
    if not name.isdigit() or int(name) in (1, os.getpid()):
        continue
    try:
        with open(f'/proc/{name}/stat', 'rb') as f:
            fields = f.read().rsplit(b')', 1)[1].split()
        with open(f'/proc/{name}/cmdline', 'rb') as f:
            argv = f.read().split(b'\\0')
    except OSError:
        continue
    if fields[0] in (b'Z', b'X'):
        continue
    cmd = b' '.join(a for a in argv if a).decode(errors='replace')
    out.append([int(name), int(fields[2]), cmd])
print(json.dumps(out))
"""

# Shared by the bookworm and trixie backends of one run.
_engine: Engine | None = None
_engine_users = 0


def _acquire_engine() -> Engine:
    global _engine, _engine_users
    if _engine is None:
        _engine = start_engine()
    _engine_users += 1
    return _engine


def _release_engine() -> None:
    global _engine, _engine_users
    _engine_users -= 1
    if _engine_users <= 0 and _engine is not None:
        _engine.close()
        _engine = None
        _engine_users = 0


@dataclass
class ContainerNode(Node):
    client: Any = field(default=None, repr=False)
    container: Any = field(default=None, repr=False)
    exec_id: str | None = None

    def host_to_node(self, path: Path) -> str:
        return "/node/" + path.resolve().relative_to(self.root.resolve()).as_posix()

    def _spawn_agent(self, argv: list[str]) -> None:
        pidfile = self.root / "agent.pid"
        with contextlib.suppress(FileNotFoundError):
            pidfile.unlink()
        script = 'echo $$ > /node/agent.pid; exec oarbank-agent "$@" >>/node/agent.log 2>&1'
        ex = self.client.api.exec_create(self.container.id, ["/bin/sh", "-c", script, "sh",
                                                             *argv])
        self.exec_id = ex["Id"]
        self.client.api.exec_start(self.exec_id, detach=True)
        deadline = time.monotonic() + 20
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _exec_info(self) -> dict[str, Any] | None:
        if self.exec_id is None:
            return None
        try:
            return self.client.api.exec_inspect(self.exec_id)
        except Exception:
            return None

    def agent_alive(self) -> bool:
        info = self._exec_info()
        return bool(info and info.get("Running"))

    def agent_exit_code(self) -> int | None:
        info = self._exec_info()
        if not info or info.get("Running"):
            return None
        return info.get("ExitCode")

    def signal_agent(self, sig: str) -> None:
        if not self.agent_alive():
            return
        pid = (self.root / "agent.pid").read_text().strip()
        if not pid.isdigit():
            raise NodeError(f"{self.node_id}: no agent pid in agent.pid ({pid!r})")
        rc, out = self.container.exec_run(["/bin/sh", "-c", f"kill -{sig} {pid}"])
        if rc != 0 and self.agent_alive():
            raise NodeError(f"{self.node_id}: kill -{sig} {pid} failed: {out!r}")

    def install_agent(self, version: str) -> str | None:
        """This checkout's agent as a wheel of ``version`` (built here: it is pure Python),
        pip-installed over the container's own agent, as a package upgrade replaces the files
        under a running agent; the next start runs it."""
        from harness.nodes.agentbuild import build_agent_wheel
        from harness.nodes.image import VENV

        wheel = build_agent_wheel(self.root / f"agent-{version}", version)
        rc, out = self.container.exec_run(
            [f"{VENV}/bin/python", "-m", "pip", "install", "--disable-pip-version-check",
             "--no-input", "--no-index", "--no-deps", "-q", self.host_to_node(wheel)])
        if rc != 0:
            raise NodeError(f"{self.node_id}: installing agent {version} failed ({rc}): "
                            f"{out.decode(errors='replace')[-1500:]}")
        return None

    def cli(self, *args: str, timeout_s: float = 120.0) -> CliResult:
        rc, (out, err) = self.container.exec_run(
            ["timeout", "-s", "KILL", str(int(timeout_s)), "oarbank-agent", *args], demux=True)
        return CliResult(rc, (out or b"").decode(errors="replace"),
                         (err or b"").decode(errors="replace"))

    def processes(self) -> list[ProcInfo]:
        """Every live process of the container but its PID 1, with the pids the node uses."""
        import docker.errors

        for attempt in range(LIST_TRIES):
            try:
                rc, out = self.container.exec_run(["python3", "-I", "-c", LIST])
            except docker.errors.NotFound:
                return []  # the container is gone: so are its processes
            except docker.errors.APIError as exc:
                if "is not running" in str(exc):
                    return []
                out, rc = str(exc).encode(), -1
            if rc == 0:
                return [ProcInfo(int(pid), int(pgid), str(cmd))
                        for pid, pgid, cmd in json.loads(out)]
            # an exec can fail now and then on a loaded engine: not "no processes"
            if attempt == LIST_TRIES - 1:
                raise NodeError(f"{self.node_id}: listing its processes failed ({rc}): "
                                f"{out[-300:]!r}")
            time.sleep(0.2)
        raise AssertionError("unreachable")

    def cleanup(self) -> None:
        if self.container is not None:
            with contextlib.suppress(Exception):
                self.container.remove(force=True)


class ContainerBackend(Backend):
    def __init__(self, release: str) -> None:
        self.release = release
        self.name = f"container:{release}"
        self.run_id = secrets.token_hex(4)
        self.engine: Engine | None = None
        self.image: str | None = None

    @classmethod
    def unavailable(cls) -> str | None:
        return engine_available()

    def setup(self, out: Path) -> dict[str, Any]:
        from harness.nodes.image import ensure_image

        self.engine = _acquire_engine()
        t0 = time.monotonic()
        img = ensure_image(self.engine.client, self.release)
        self.image = img.tag
        return {"image": img.tag, "python": img.python, "engine": self.engine.url,
                "engine_started_by_harness": self.engine.started_by_us,
                "base_built_s": img.base_built_s, "project_built_s": img.project_built_s,
                "image_ready_s": round(time.monotonic() - t0, 1)}

    def teardown(self) -> None:
        if self.engine is not None:
            for c in self._containers():
                with contextlib.suppress(Exception):
                    c.remove(force=True)
            self.engine = None
            _release_engine()

    def _containers(self) -> list[Any]:
        assert self.engine is not None
        return self.engine.client.containers.list(
            all=True, filters={"label": f"{LABEL}={self.run_id}"})

    def make_node(self, node_id: str, root: Path, modules: list[Path],
                  settings: dict[str, dict[str, Any]], portal: Any) -> Node:
        assert self.engine is not None and self.image is not None
        root.mkdir(parents=True, exist_ok=True)
        copies = copy_modules(root, modules)
        volumes = {str(root.resolve()): {"bind": "/node", "mode": "rw"}}
        portal_url = None
        if portal is not None:
            volumes[str(portal.folder.resolve())] = {"bind": "/portal", "mode": "rw"}
            portal_url = f"unix:/portal/{portal.socket_path.name}"
        name = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"oarbank-e2e-{self.run_id}-{node_id}")
        ctr = self.engine.client.containers.run(
            self.image, ["python3", "-I", "-c", INIT], detach=True, name=name,
            hostname=node_id, network_mode="none", volumes=volumes,
            labels={LABEL: self.run_id}, working_dir="/node",
        )
        return ContainerNode(node_id=node_id, root=root, modules=copies,
                             settings=dict(settings), portal_url=portal_url,
                             portal_token=portal.issue_token(node_id) if portal else None,
                             client=self.engine.client, container=ctr)

    def leftovers(self) -> list[str]:
        if self.engine is None:
            return []
        return [f"container {c.name} ({c.status})" for c in self._containers()]
