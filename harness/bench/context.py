"""What the figures share in one run: the temp dir, the bench agent, the baseline servers."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .agentproc import BENCH_MODULE, PYSPY_RATE, Agent
from .config import Params
from .profile import summarize

__all__ = ["Bench", "MODULE_ID"]

MODULE_ID = "dev.oarbank.bench"


class Bench:
    def __init__(self, params: Params, quick: bool, keep: bool = False,
                 profile: Path | None = None) -> None:
        self.params = params
        self.profile = profile  # a folder: py-spy collapsed stacks of each agent
        self.quick = quick
        self.keep = keep
        # /tmp, not the repo: unix socket paths (the control socket) must stay short.
        self.tmp = Path(tempfile.mkdtemp(prefix="oarbank-bench-"))
        self._agent: Agent | None = None
        self.figure = "bench"  # the figure running now (names its profile file)
        self._baseline: subprocess.Popen[str] | None = None
        self._addrs: dict[str, Any] | None = None
        self.failed = False

    # --- the bench agent (figures 2-6) -----------------------------------------------------

    def agent(self) -> Agent:
        if self._agent is None:
            self._agent = Agent(self.tmp / "state", [BENCH_MODULE],
                                {"bench": {"slots": 64,
                                           "probe_load_s": self.params.ready_load_s}},
                                profile=self.profile_path(f"{self.figure}-bench-agent"))
        return self._agent

    def begin_figure(self, key: str) -> None:
        """With ``--profile``: the agent's profile of this figure goes to its own file."""
        self.figure = key
        if self._agent is not None and self.profile is not None:
            self._agent.profile_to(self.profile / f"{key}-bench-agent.txt")

    def figure_profile(self, key: str) -> dict[str, Any] | None:
        """With ``--profile``: the summary of what the agent did during figure ``key``."""
        if self.profile is None:
            return None
        if self._agent is not None:
            self._agent.profile_to(self.profile / "between-figures-bench-agent.txt")  # flushes
        return summarize(sorted(self.profile.glob(f"{key}-*.txt")), PYSPY_RATE)

    def profile_path(self, name: str) -> Path | None:
        return None if self.profile is None else self.profile / f"{name}.txt"

    def module_data(self) -> Path:
        return self.tmp / "state" / "modules" / MODULE_ID / "data"

    # --- loopback baselines ---------------------------------------------------------------

    def baseline_addrs(self) -> dict[str, Any]:
        if self._addrs is None:
            self._baseline = subprocess.Popen(
                [sys.executable, "-I", str(BENCH_MODULE / "bench_http.py"), "baseline",
                 str(self.tmp / "baseline.sock")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                start_new_session=True)
            assert self._baseline.stdout is not None
            line = self._baseline.stdout.readline()
            if not line:
                raise RuntimeError("the baseline servers did not start")
            self._addrs = json.loads(line)
        return self._addrs

    def client(self, args: dict[str, Any]) -> subprocess.Popen[str]:
        """A baseline client process (the same loops the runner runs), started now."""
        return subprocess.Popen([sys.executable, "-I", str(BENCH_MODULE / "bench_client.py"),
                                 json.dumps(args)], stdout=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)

    @staticmethod
    def client_result(proc: subprocess.Popen[str], timeout: float = 120.0) -> dict[str, Any]:
        out, _ = proc.communicate(timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"baseline client exited with {proc.returncode}")
        return json.loads(out)

    # --- the end --------------------------------------------------------------------------

    def close(self) -> None:
        if self._agent is not None:
            self._agent.stop()
            self._agent = None
        if self._baseline is not None:
            assert self._baseline.stdin is not None
            self._baseline.stdin.close()
            try:
                self._baseline.wait(10)
            except subprocess.TimeoutExpired:
                self._baseline.kill()
                self._baseline.wait()
            if self._baseline.stdout:
                self._baseline.stdout.close()
            self._baseline = None
        if self.keep or self.failed:
            print(f"bench: logs and state kept in {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)
