"""The `local` backend: each node is an `oarbank-agent run` process on this machine."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.nodes import procs
from harness.nodes.agentbuild import install_agent_version
from harness.nodes.backends.base import Backend, CliResult, Node, copy_modules

__all__ = ["LocalBackend", "LocalNode", "agent_command"]


def agent_command() -> list[str] | None:
    """`oarbank-agent` next to this interpreter (the nox venv) or on PATH."""
    exe = "oarbank-agent.exe" if os.name == "nt" else "oarbank-agent"
    here = Path(sys.executable).parent / exe
    if here.exists():
        return [str(here)]
    found = shutil.which("oarbank-agent")
    return [found] if found else None


@dataclass
class LocalNode(Node):
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    past_agents: list[int] = field(default_factory=list, repr=False)
    installed: list[str] | None = None  # an agent version installed since (install_agent)

    def host_to_node(self, path: Path) -> str:
        return str(path)

    def _command(self) -> list[str] | None:
        return self.installed or agent_command()

    def install_agent(self, version: str) -> str | None:
        self.installed = [str(install_agent_version(self.root / f"agent-{version}", version))]
        return None

    def _spawn_agent(self, argv: list[str]) -> None:
        cmd = self._command()
        assert cmd is not None
        with open(self.root / "agent.log", "ab") as log:
            kwargs: dict[str, Any] = {}
            if os.name == "nt":
                kwargs["creationflags"] = subprocess.CREATE_NEW_PROCESS_GROUP  # type: ignore[attr-defined]
            else:
                kwargs["start_new_session"] = True
            self.proc = subprocess.Popen([*cmd, *argv], stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, **kwargs)
        procs.OWNED.add(self.proc.pid)
        self.past_agents.append(self.proc.pid)

    def agent_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def agent_exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    @property
    def agent_pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def signal_agent(self, sig: str) -> None:
        if not self.agent_alive():
            return
        assert self.proc is not None
        if sig == "KILL":
            self.proc.kill()  # SIGKILL on POSIX, TerminateProcess on Windows
        elif os.name == "nt":
            self.proc.send_signal(signal.CTRL_BREAK_EVENT)  # type: ignore[attr-defined]
        else:
            self.proc.send_signal(signal.SIGTERM)

    def cli(self, *args: str, timeout_s: float = 120.0) -> CliResult:
        cmd = self._command()
        assert cmd is not None
        try:
            r = subprocess.run([*cmd, *args], capture_output=True, text=True,
                               timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            return CliResult(124, str(exc.stdout or ""), f"timed out after {timeout_s}s")
        return CliResult(r.returncode, r.stdout, r.stderr)

    def processes(self) -> list[procs.ProcInfo]:
        procs.reap_children()
        also = {self.proc.pid} if self.agent_alive() and self.proc else set()
        return procs.processes_under(self.root, also=also)

    def cleanup(self) -> None:
        if self.agent_alive():
            self.signal_agent("KILL")
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            procs.OWNED.discard(self.proc.pid)
        procs.end_processes(procs.processes_under(self.root))


class LocalBackend(Backend):
    name = "local"

    @classmethod
    def unavailable(cls) -> str | None:
        if agent_command() is None:
            return "oarbank-agent is not installed (pip install -e sdk -e agent)"
        return None

    def setup(self, out: Path) -> dict[str, Any]:
        procs.become_subreaper()
        return {}

    def make_node(self, node_id: str, root: Path, modules: list[Path],
                  settings: dict[str, dict[str, Any]], portal: Any) -> Node:
        root.mkdir(parents=True, exist_ok=True)
        copies = copy_modules(root, modules)
        return LocalNode(node_id=node_id, root=root, modules=copies, settings=dict(settings),
                         portal_url=portal.agent_url if portal else None,
                         portal_token=portal.issue_token(node_id) if portal else None)
