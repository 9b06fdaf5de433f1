"""The portal of a run: `oarbank-portal serve` on the host, queried over HTTP with requests.

On POSIX it serves on a unix socket (agents on the host and in containers reach it there;
the socket's folder is bind-mounted into containers). Windows has no AF_UNIX in Python: there,
and for a backend whose agents run Windows' Python (`tcp`), it listens on 127.0.0.1 with a port
the OS picks.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import requests

from harness.e2e.unixhttp import unix_session
from harness.nodes import procs

__all__ = ["Portal", "portal_command"]


def portal_command() -> list[str] | None:
    """How to run `oarbank-portal` next to this interpreter (the nox venv), or None."""
    here = Path(sys.executable).parent / ("oarbank-portal.exe" if os.name == "nt"
                                          else "oarbank-portal")
    if here.exists():
        return [str(here)]
    found = shutil.which("oarbank-portal")
    return [found] if found else None


class Portal:
    def __init__(self, folder: Path, modules: list[Path], *, tcp: bool = False) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        cmd = portal_command()
        if cmd is None:
            raise RuntimeError("oarbank-portal is not installed (pip install -e ui-pages)")
        self.unix = not tcp and hasattr(__import__("socket"), "AF_UNIX") and os.name != "nt"
        self.socket_path = folder / "portal.sock"
        argv = [*cmd, "serve", "--db", str(folder / "portal.db")]
        for m in modules:
            argv += ["--module", str(m)]
        argv += ["--unix", str(self.socket_path)] if self.unix else ["--listen", "127.0.0.1:0"]
        self.log = folder / "portal.log"
        self._log_f = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=self._log_f, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        procs.OWNED.add(self.proc.pid)
        self.url = self._wait_serving(30.0)
        self.session: requests.Session = (
            unix_session(str(self.socket_path)) if self.unix else requests.Session()
        )
        if not self.unix:
            self.session.trust_env = False

    def _wait_serving(self, timeout_s: float) -> str:
        """The `oarbank-portal: serving on <url>` line tells us it accepts requests."""
        assert self.proc.stdout is not None
        # readline() blocks: a watchdog ends a portal that neither serves nor exits.
        watchdog = threading.Timer(timeout_s, self.proc.kill)
        watchdog.start()
        line = b""
        try:
            while True:
                line = self.proc.stdout.readline()
                if not line:
                    break
                m = re.search(rb"serving on (\S+)", line)
                if m:
                    return m.group(1).decode()
        finally:
            watchdog.cancel()
        self.stop()
        raise RuntimeError(f"the portal did not start: {line!r}; see {self.log}: "
                           f"{self.log.read_text(errors='replace')[-1500:]}")

    @property
    def agent_url(self) -> str:
        """What an agent on the host passes as `--portal`."""
        return f"unix:{self.socket_path}" if self.unix else self.url

    @property
    def base(self) -> str:
        return "http://portal" if self.unix else self.url

    def issue_token(self, node_id: str) -> str:
        """A token for `node_id` (the portal refuses reports without one): what an operator
        runs, `oarbank-portal token issue NODE_ID`."""
        cmd = portal_command()
        assert cmd is not None
        r = subprocess.run([*cmd, "token", "issue", node_id, "--db",
                            str(self.folder / "portal.db")], capture_output=True, text=True,
                           timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"oarbank-portal token issue {node_id}: {r.stderr.strip()}")
        return r.stdout.strip()

    def services(self, module: str, **filters: str) -> list[dict[str, Any]]:
        """The `services` host query: one row per node and service of `module`."""
        r = self.session.get(f"{self.base}/v1/queries/services",
                             params={"module": module, **filters}, timeout=10)
        r.raise_for_status()
        body = r.json()
        rows = body.get("rows", body) if isinstance(body, dict) else body
        if not isinstance(rows, list):
            raise RuntimeError(f"services query answered {body!r}, not a list of rows")
        return rows

    def row(self, module: str, node_id: str, service: str) -> dict[str, Any] | None:
        rows = self.services(module, node_id=node_id, service=service)
        return rows[0] if rows else None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        procs.OWNED.discard(self.proc.pid)
        with contextlib.suppress(Exception):
            self.session.close()
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log_f.close()
        return self.proc.returncode
