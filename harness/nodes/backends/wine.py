"""The `wine` backend: each node is a Windows agent, Windows' own python.exe under Wine.

Opt-in (run only when named, `--backend wine`). The node's files stay on this machine and the
agent sees them through Wine's ``Z:`` drive. What differs from `local`, and why:
- the agent's output comes through a pipe that a thread copies to agent.log: python.exe dies
  at start when its stdio is a regular file;
- "KILL" kills the agent's Wine process (a Windows process is one Linux process under Wine):
  nothing of the agent runs its shutdown, as with TerminateProcess, and its kill-on-close job
  objects take its ops, services and runners with it;
- "TERM" is the agent's own stop on Windows, ``oarbank-agent drain``: the console Ctrl-Break
  an operator would press does not reach a process under Wine;
- processes are listed from inside (a python.exe with psutil): Windows pids, which are what
  the agent, model.loads and job provenance name; under Wine psutil gives pids, command lines
  and working directories, not names or exe paths;
- the portal listens on TCP loopback: Windows' Python has no AF_UNIX.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.nodes import procs, wine
from harness.nodes.backends.base import Backend, CliResult, Node, copy_modules

__all__ = ["WineBackend", "WineNode"]

# Every Windows process but this one: pid, command line, working directory (JSON, one list).
_LIST = ("import json, os, psutil\n"
         "out = []\n"
         "for p in psutil.process_iter():\n"
         "    if p.pid == os.getpid():\n"
         "        continue\n"
         "    try:\n"
         "        cmd = ' '.join(p.cmdline())\n"
         "    except psutil.Error:\n"
         "        continue\n"
         "    try:\n"
         "        cwd = p.cwd()\n"
         "    except psutil.Error:\n"
         "        cwd = ''\n"
         "    out.append([p.pid, cmd, cwd])\n"
         "print(json.dumps(out))\n")
# TerminateProcess on each pid given (what is left of a node at cleanup).
_KILL = ("import sys, psutil\n"
         "for pid in map(int, sys.argv[1:]):\n"
         "    try:\n"
         "        psutil.Process(pid).kill()\n"
         "    except psutil.Error:\n"
         "        pass\n")


@dataclass
class WineNode(Node):
    python: list[str] = field(default_factory=list, repr=False)  # the loader and python.exe
    env: dict[str, str] = field(default_factory=dict, repr=False)
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    copier: threading.Thread | None = field(default=None, repr=False)

    def host_to_node(self, path: Path) -> str:
        return wine.windows_path(path)

    def _python(self, args: list[str], timeout_s: float) -> CliResult:
        try:
            r = subprocess.run([*self.python, *args], capture_output=True, text=True,
                               timeout=timeout_s, stdin=subprocess.DEVNULL, env=self.env,
                               cwd=self.root)
        except subprocess.TimeoutExpired as exc:
            return CliResult(124, str(exc.stdout or ""), f"timed out after {timeout_s}s")
        return CliResult(r.returncode, r.stdout, r.stderr)

    def _spawn_agent(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            [*self.python, "-m", "oarbank_agent", *argv], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env, cwd=self.root,
            start_new_session=True)
        procs.OWNED.add(self.proc.pid)
        out, log_path = self.proc.stdout, self.root / "agent.log"
        assert out is not None

        def copy() -> None:
            with open(log_path, "ab") as log:
                for chunk in iter(lambda: os.read(out.fileno(), 65536), b""):
                    log.write(chunk.replace(b"\r\n", b"\n"))
                    log.flush()

        self.copier = threading.Thread(target=copy, daemon=True)
        self.copier.start()

    def agent_alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def agent_exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal_agent(self, sig: str) -> None:
        if not self.agent_alive():
            return
        assert self.proc is not None
        if sig == "KILL":
            self.proc.send_signal(signal.SIGKILL)  # the Windows process itself, as Wine runs it
        else:  # Ctrl-Break does not reach under Wine: the agent's own stop request
            r = self.cli("drain", "--state-dir", self.host_to_node(self.state_dir),
                         timeout_s=60)
            if r.rc != 0 and self.agent_alive():
                raise RuntimeError(f"{self.node_id}: oarbank-agent drain failed: {r}")

    def cli(self, *args: str, timeout_s: float = 120.0) -> CliResult:
        return self._python(["-m", "oarbank_agent", *args], timeout_s)

    def processes(self) -> list[procs.ProcInfo]:
        """The node's Windows processes: those whose command line names the node's folder
        (every op, service and runner, and the agent) or that run in it (a service's helper)."""
        r = self._python(["-c", _LIST], 60)
        if r.rc != 0:
            raise RuntimeError(f"{self.node_id}: listing the Windows processes failed: {r}")
        root = self.host_to_node(self.root).lower()
        out = []
        for pid, cmd, cwd in json.loads(r.stdout):
            if root in cmd.lower() or cwd.lower().startswith(root):
                out.append(procs.ProcInfo(int(pid), None, cmd))
        return out

    def read_lines(self, name: str) -> list[str]:
        # Windows' text files end their lines with CRLF.
        return [ln.rstrip("\r") for ln in super().read_lines(name)]

    def cleanup(self) -> None:
        if self.agent_alive():
            self.signal_agent("KILL")
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            procs.OWNED.discard(self.proc.pid)
        if self.copier is not None:
            self.copier.join(timeout=2.0)  # a Wine service may hold the pipe: don't wait on it
        with contextlib.suppress(Exception):
            left = [str(p.pid) for p in self.processes()]
            if left:
                self._python(["-c", _KILL, *left], 60)
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


class WineBackend(Backend):
    name = "wine"
    portal_over_tcp: ClassVar[bool] = True
    cannot_show: ClassVar[dict[str, str]] = {
        "listener-refused": "Windows' network wall is an AppContainer launcher, which the "
                            "agent has not yet and Wine does not implement (status says "
                            "windows_appcontainer unavailable; --sandbox required refuses)",
        "agent-upgrade": "--keep-services has no keeper on Windows yet (the agent refuses "
                         "the flag there, naming it)",
    }

    def __init__(self) -> None:
        self.python: list[str] = []
        self.env: dict[str, str] = {}

    @classmethod
    def unavailable(cls) -> str | None:
        if wine.wine_loader() is None:
            return (f"Wine is not installed (`apt-get install {wine.WINE_PACKAGE}`: "
                    f"{wine.WINE_LOADERS[0]})")
        return None

    def setup(self, out: Path) -> dict[str, Any]:
        self.python, self.env = wine.prepare()
        return {"python": wine.windows_path(Path(self.python[-1])), "cache": str(wine.CACHE)}

    def teardown(self) -> None:
        wine.end_wine()  # every Windows process of the prefix, and its wineserver

    def make_node(self, node_id: str, root: Path, modules: list[Path],
                  settings: dict[str, dict[str, Any]], portal: Any) -> Node:
        root.mkdir(parents=True, exist_ok=True)
        copies = copy_modules(root, modules)
        return WineNode(node_id=node_id, root=root, modules=copies, settings=dict(settings),
                        portal_url=portal.agent_url if portal else None,
                        portal_token=portal.issue_token(node_id) if portal else None,
                        python=list(self.python), env=dict(self.env))
