"""What every backend provides: nodes an operator drives from the outside.

A `Node` is one agent with its own state dir and node id, reached only through the agent's
command line (`run`, `submit`, `status --json`) and the node's files. Backends differ in
where the agent runs (a process here, a container) and how its command line is reached.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.nodes.procs import ProcInfo
from testsupport.livefiles import complete_lines

__all__ = ["CliResult", "Node", "Backend", "NodeError", "FINAL_STATES"]

FINAL_STATES = ("succeeded", "failed")


class NodeError(RuntimeError):
    """The node did not do what the harness asked (the message says what and shows output)."""


@dataclass(frozen=True)
class CliResult:
    rc: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"exit {self.rc}; stdout {self.stdout[-800:]!r}; stderr {self.stderr[-800:]!r}"


@dataclass
class Node(ABC):
    node_id: str
    root: Path  # this node's folder on the host: state/, modules/, settings/, agent.log
    modules: list[Path]  # module folders (copies) on the host, under root/modules
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # module -> settings
    portal_url: str | None = None  # what the agent is given as --portal (None: no portal)
    portal_token: str | None = None  # this node's token on that portal (it refuses reports
    # without one); written to root/portal.token (0600) for --portal-token-file
    jobs: list[str] = field(default_factory=list)  # every job id submitted through the node
    agent_starts: int = 0
    # What runs the agent, when something does (VM: "systemd", whose unit ends a crashed
    # agent's cgroup and restarts it); None: the harness alone.
    supervisor: ClassVar[str | None] = None
    # What a config file a scenario gives the agent must also say on this backend (the VM:
    # its log file, which the unit's own config file says and a --config replaces).
    base_config: ClassVar[str] = ""

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    # --- what a backend implements ----------------------------------------------------------

    @abstractmethod
    def host_to_node(self, path: Path) -> str:
        """The path the agent sees for a host path under root."""

    @abstractmethod
    def _spawn_agent(self, argv: list[str]) -> None:
        """Start `oarbank-agent <argv>` in the background; its output goes to agent.log."""

    @abstractmethod
    def agent_alive(self) -> bool: ...

    @abstractmethod
    def signal_agent(self, sig: str) -> None:
        """Send "TERM" or "KILL" to the agent process."""

    @abstractmethod
    def agent_exit_code(self) -> int | None:
        """The agent's exit status once it has ended (None while alive or unknown)."""

    @abstractmethod
    def cli(self, *args: str, timeout_s: float = 120.0) -> CliResult:
        """Run `oarbank-agent <args>` on the node."""

    @abstractmethod
    def processes(self) -> list[ProcInfo]:
        """Every live process of this node (the agent, its ops, services and runners, and
        whatever they left behind)."""

    @abstractmethod
    def cleanup(self) -> None:
        """End whatever is left of the node (processes, container). Idempotent."""

    def push(self, path: Path) -> None:  # noqa: B027 - most backends share the node folder
        """Make a file written under root since the node started visible to its agent."""

    def install_agent(self, version: str) -> str | None:
        """Install agent ``version`` on the node, as an upgrade would: the next starts run it.
        None once done; else why this backend cannot (the scenario says so)."""
        return f"the {type(self).__name__} cannot install another agent version yet"

    # --- the agent's life -------------------------------------------------------------------

    def start_agent(self, *flags: str, wait_s: float = 60.0) -> None:
        """`oarbank-agent run` with this node's state dir, modules, node id, settings and
        portal, plus `flags`; returns once `status` answers."""
        argv = ["run", "--state-dir", self.host_to_node(self.state_dir),
                "--node-id", self.node_id]
        for m in self.modules:
            argv += ["--module", self.host_to_node(m)]
        for module, values in self.settings.items():
            f = self.root / "settings" / f"{module}.json"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(values))
            argv += ["--settings", f"{module}={self.host_to_node(f)}"]
        if self.portal_url:
            argv += ["--portal", self.portal_url]
            if self.portal_token:
                token_file = self.root / "portal.token"
                fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as token_out:
                    token_out.write(self.portal_token + "\n")
                argv += ["--portal-token-file", self.host_to_node(token_file)]
        argv += list(flags)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.agent_starts += 1
        with open(self.root / "agent.log", "a", encoding="utf-8") as log:
            log.write(f"--- harness: start #{self.agent_starts}: oarbank-agent {' '.join(argv)}\n")
        self._spawn_agent(argv)
        deadline = time.monotonic() + wait_s
        last: CliResult | None = None
        while time.monotonic() < deadline:
            if not self.agent_alive():
                raise NodeError(f"{self.node_id}: the agent exited "
                                f"({self.agent_exit_code()}) on start: {self.log_tail()}")
            last = self.cli("status", "--state-dir", self.host_to_node(self.state_dir),
                            "--json", timeout_s=20)
            if last.rc == 0:
                return
            time.sleep(0.2)
        raise NodeError(f"{self.node_id}: status did not answer within {wait_s:.0f}s: {last}")

    def stop_agent(self, timeout_s: float = 90.0) -> int | None:
        """SIGTERM, as an operator stops it; the agent stops its services and exits. Returns
        its exit status (SIGKILL after `timeout_s` raises NodeError)."""
        if not self.agent_alive():
            return self.agent_exit_code()
        self.signal_agent("TERM")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.agent_alive():
                return self.agent_exit_code()
            time.sleep(0.1)
        self.signal_agent("KILL")
        raise NodeError(f"{self.node_id}: the agent did not stop within {timeout_s:.0f}s "
                        "of SIGTERM (killed)")

    def restart_agent(self, *flags: str) -> int | None:
        """Stop the agent and start it again with ``flags``, as a package upgrade does (under
        systemd: ``systemctl restart``). The stopped agent's exit status."""
        rc = self.stop_agent()
        self.start_agent(*flags)
        return rc

    def kill_agent(self) -> None:
        """`kill -9` the agent: nothing of it runs its shutdown."""
        self.signal_agent("KILL")
        deadline = time.monotonic() + 30
        while self.agent_alive():
            if time.monotonic() > deadline:
                raise NodeError(f"{self.node_id}: the agent survived SIGKILL for 30 s")
            time.sleep(0.05)

    def started_note(self) -> str | None:
        """What the backend did to bring the node up, for the evidence (e.g. a VM's boot)."""
        return None

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.root / "agent.log").read_text(errors="replace")[-n:]
        except OSError:
            return "(no agent.log)"

    # --- the operator's commands ------------------------------------------------------------

    def submit(self, module: str, stage: str, payload: Any, *, wait: bool = False,
               timeout_s: float | None = None) -> dict[str, Any]:
        """Submit a job. Without `wait`: {"job_id": ...}; with it: the final job record.
        Non-JSON payloads (for the bad-input paths) go as given when `payload` is a str."""
        text = payload if isinstance(payload, str) else json.dumps(payload)
        args = ["submit", "--state-dir", self.host_to_node(self.state_dir), "--module", module,
                "--stage", stage, "--payload", text]
        if wait:
            args.append("--wait")
            if timeout_s:
                args += ["--timeout", str(timeout_s)]
        r = self.cli(*args, timeout_s=(timeout_s or 120) + 30)
        if wait:
            try:
                record = json.loads(r.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                raise NodeError(f"{self.node_id}: submit --wait gave no job record: {r}; "
                                f"{self._jobs_then()}")
            if record.get("job_id"):
                self.jobs.append(record["job_id"])
            return {**record, "_rc": r.rc}
        if r.rc != 0:
            raise NodeError(f"{self.node_id}: submit refused: {r}")
        job_id = r.stdout.strip().splitlines()[-1].strip()
        self.jobs.append(job_id)
        return {"job_id": job_id}

    def submit_raw(self, *args: str) -> CliResult:
        """`submit` exactly as given (for refusals: exit code and message)."""
        return self.cli("submit", "--state-dir", self.host_to_node(self.state_dir), *args)

    def status(self) -> dict[str, Any]:
        # every job, not the agent's default page of the 50 latest (job_states, wait_jobs)
        r = self.cli("status", "--state-dir", self.host_to_node(self.state_dir), "--json",
                     "--per-page", "0", timeout_s=30)
        if r.rc != 0:
            raise NodeError(f"{self.node_id}: status failed: {r}")
        try:
            return json.loads(r.stdout)
        except ValueError:
            raise NodeError(f"{self.node_id}: status --json is not JSON: {r}")

    def service_row(self, module: str, service: str) -> dict[str, Any] | None:
        """The node's row for one service, from `status --json` (contract section 6)."""
        for row in self.status().get("services", []):
            if row.get("service") == service and module in (
                row.get("module"), str(row.get("module", "")).rsplit(".", 1)[-1]
            ):
                return row
        return None

    def _jobs_then(self) -> str:
        """What the agent says of its jobs, for an error where the CLI said nothing (seen once
        under Wine: `submit --wait` exited 1 with no output; did the job run, and end how?)."""
        try:
            jobs = self.job_states().values()
        except NodeError as exc:
            return f"and then {exc}"
        return "the agent's jobs then: " + ", ".join(
            f"{j['job_id']} {j.get('state')} ({j.get('attempts')} attempt(s))" for j in jobs)

    def job_states(self) -> dict[str, dict[str, Any]]:
        """Every job the agent lists, by id."""
        return {j["job_id"]: j for j in self.status().get("jobs", []) if "job_id" in j}

    def find_files(self, name: str) -> list[Path]:
        """Files called `name` anywhere under the node's state dir, seen from the host."""
        return sorted(self.state_dir.rglob(name))

    def read_lines(self, name: str) -> list[str]:
        """Non-empty lines of the node's file `name` (e.g. the example's model.loads) that its
        writer has finished (a live service may be writing the last one)."""
        out: list[str] = []
        for f in self.find_files(name):
            out += [ln for ln in complete_lines(f.read_text(errors="replace")) if ln.strip()]
        return out


class Backend(ABC):
    name: str
    # The run's portal listens on TCP loopback, not a unix socket (Windows' Python has none).
    portal_over_tcp: ClassVar[bool] = False
    # Scenarios this backend's agents cannot show, with why: a run that names no scenario
    # leaves them out saying so; named with --scenario they run (and fail, saying what lacks).
    cannot_show: ClassVar[dict[str, str]] = {}

    @classmethod
    @abstractmethod
    def unavailable(cls) -> str | None:
        """Why this backend cannot run on this machine, or None."""

    def setup(self, out: Path) -> dict[str, Any]:
        """Prepare once per run; returns facts for the report (e.g. image build times)."""
        return {}

    def teardown(self) -> None:  # noqa: B027 - most backends have nothing to undo
        """Undo `setup` (stop what it started)."""

    @abstractmethod
    def make_node(self, node_id: str, root: Path, modules: list[Path],
                  settings: dict[str, dict[str, Any]], portal: Any) -> Node:
        """A node whose agent is not started yet. `modules` are folders to copy in."""

    def leftovers(self) -> list[str]:
        """What of this backend's runs is still there after cleanup (e.g. containers)."""
        return []


BASE_FILE = "harness-base.txt"
REPO = Path(__file__).resolve().parents[3]


def copy_modules(root: Path, modules: list[Path]) -> list[Path]:
    """Each node gets its own copy of its modules, so processes are found by path and a
    node's files never mix with another's. A module with `harness-base.txt` is completed with
    the files of the folder it names (see harness/e2e/modules/README.md)."""
    out = []
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", BASE_FILE)
    for m in modules:
        dest = root / "modules" / m.name
        if dest.exists():
            shutil.rmtree(dest)
        base_file = m / BASE_FILE
        if base_file.is_file():
            base = REPO / base_file.read_text().strip()
            shutil.copytree(base, dest, ignore=ignore)
            shutil.copytree(m, dest, ignore=ignore, dirs_exist_ok=True)
        else:
            shutil.copytree(m, dest, ignore=ignore)
        out.append(dest)
    return out
