"""Scenarios: the registry, and the context a scenario runs in.

A scenario is a function `fn(ctx)` registered with `@scenario(name, summary)`. It drives
nodes from the outside (`ctx.node(...)`, the portal's `services` query) and records what it
sees with `ctx.note`; `ctx.check` fails it with a message. After the function returns, the
runner itself checks, for every scenario:
- nothing lost: every job submitted through a node reached a final state (succeeded, unless
  the scenario declared another outcome with `ctx.expect_final(job_id, state)`);
- nothing left: once the agents are stopped, no process of any node survives, and the backend
  has nothing left (no container).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from harness.nodes.backends.base import FINAL_STATES, Backend, Node

__all__ = ["Scenario", "ScenarioFailed", "Ctx", "SCENARIOS", "scenario", "MODULES_DIR",
           "module_path", "modules_dir", "use_modules_dir",
           "EXAMPLES_DIR"]

MODULES_DIR = Path(__file__).resolve().parent / "modules"
_modules_dir = MODULES_DIR


def use_modules_dir(path: Path) -> None:
    """Take the test modules from `path` instead of harness/e2e/modules (the harness's own tests
    use it to run a scenario on a module changed so that the behaviour looks broken)."""
    global _modules_dir
    _modules_dir = path.resolve()


def modules_dir() -> Path:
    return _modules_dir
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"

T = TypeVar("T")
SHORT_PATH_MAX = 60  # + "/state/control.sock" and the like stays well under 104 bytes


class ScenarioFailed(AssertionError):
    """What the scenario expected did not happen; the message says what was seen."""


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    fn: Callable[[Ctx], None]
    needs_portal: bool = False
    # Sandbox walls (the agent's `status` names) the scenario's evidence rests on: where the
    # node's kernel lacks one, the cell fails saying so instead of passing on what it could
    # not show (harness.e2e.runner.missing_walls).
    walls: tuple[str, ...] = ()
    # Run only when named (`--scenario NAME`), with why: a scenario that needs what only some
    # backends' kernels give (and fails, saying so, on the others). The default run lists it.
    opt_in: str | None = None


SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, summary: str, *, needs_portal: bool = False,
             walls: tuple[str, ...] = (), opt_in: str | None = None
             ) -> Callable[[Callable[[Ctx], None]], Callable[[Ctx], None]]:
    def register(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        if name in SCENARIOS:
            raise ValueError(f"scenario {name!r} registered twice")
        SCENARIOS[name] = Scenario(name, summary, fn, needs_portal, walls, opt_in)
        return fn

    return register


@dataclass
class Ctx:
    backend: Backend
    folder: Path  # this scenario's folder under the out dir (node folders, portal, logs)
    agent_flags: tuple[str, ...] = ()  # extra flags for every agent (harness tests break
    #                                    behaviours with them)
    portal: Any = None
    nodes: list[Node] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    expected: dict[str, tuple[str, ...]] = field(default_factory=dict)  # job id -> states
    t0: float = field(default_factory=time.monotonic)
    relocated: dict[Path, Path] = field(default_factory=dict)  # out-dir path -> short path

    def place(self, name: str) -> Path:
        """A folder for a node or the portal. Under the scenario's folder when its paths stay
        short enough for unix sockets (the agent's control socket and the portal's socket live
        in them; the limit is about 100 bytes); otherwise in a short temporary folder, linked
        from the scenario's folder, whose logs are copied back when the scenario ends."""
        want = self.folder / name
        if len(str(want.resolve())) <= SHORT_PATH_MAX:
            return want
        base = Path(tempfile.gettempdir()) / f"oarbank-e2e-{os.getpid()}"
        short = base / f"{len(self.relocated)}{secrets.token_hex(2)}-{name}"[:40]
        short.mkdir(parents=True)
        with contextlib.suppress(OSError):
            want.symlink_to(short, target_is_directory=True)
        self.relocated[want] = short
        return short

    def bring_back(self) -> None:
        """Copy the logs of relocated folders into the scenario's folder; remove the rest."""
        for want, short in self.relocated.items():
            if want.is_symlink():
                want.unlink()
            want.mkdir(parents=True, exist_ok=True)
            for log in short.rglob("*.log"):
                dest = want / log.relative_to(short)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(OSError):
                    shutil.copy2(log, dest)
            shutil.rmtree(short, ignore_errors=True)
            with contextlib.suppress(OSError):
                short.parent.rmdir()  # the run's base folder, once empty
        self.relocated.clear()

    # --- recording and failing --------------------------------------------------------------

    def note(self, text: str) -> None:
        self.evidence.append(f"[{time.monotonic() - self.t0:6.1f}s] {text}")

    def check(self, cond: object, message: str) -> None:
        if not cond:
            raise ScenarioFailed(message)

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout_s: float,
                 interval_s: float = 0.25) -> T:
        """Poll `probe` until it returns something truthy; ScenarioFailed naming `what` and
        the last value seen when `timeout_s` passes. (The harness is an outside observer:
        polling the public surfaces is all it can do.)"""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            last = probe()
            if last:
                return last
            if time.monotonic() > deadline:
                raise ScenarioFailed(f"timed out after {timeout_s:.0f}s waiting for {what}; "
                                     f"last seen: {_short(last)}")
            time.sleep(interval_s)

    # --- nodes ------------------------------------------------------------------------------

    def node(self, node_id: str, modules: list[str | Path], *,
             settings: dict[str, dict[str, Any]] | None = None, start: bool = True,
             flags: tuple[str, ...] = ()) -> Node:
        """A node running `modules` (names under harness/e2e/modules, `example:<name>` for
        examples/<name>, or paths), its agent started with `flags` + the run's agent flags."""
        paths = [module_path(m) for m in modules]
        n = self.backend.make_node(node_id, self.place(node_id), paths, settings or {},
                                   self.portal)
        self.nodes.append(n)
        if n.started_note():
            self.note(str(n.started_note()))
        if start:
            self.start(n, *flags)
        return n

    def start(self, node: Node, *flags: str) -> None:
        node.start_agent(*flags, *self.agent_flags)
        self.note(f"{node.node_id}: agent started (start #{node.agent_starts})")

    def expect_final(self, job_id: str, *states: str) -> None:
        self.expected[job_id] = states

    def wait_jobs(self, node: Node, job_ids: list[str], timeout_s: float
                  ) -> dict[str, dict[str, Any]]:
        """Wait until every job in `job_ids` is in a final state; their records by id."""
        def done() -> dict[str, dict[str, Any]] | None:
            states = node.job_states()
            if all(states.get(j, {}).get("state") in FINAL_STATES for j in job_ids):
                return {j: states[j] for j in job_ids}
            return None

        try:
            return self.wait_for(f"{len(job_ids)} job(s) on {node.node_id} to finish", done,
                                 timeout_s, 0.5)
        except ScenarioFailed:
            states = node.job_states()
            summary = {j: states.get(j, {}).get("state", "MISSING") for j in job_ids}
            raise ScenarioFailed(f"jobs on {node.node_id} not finished after {timeout_s:.0f}s:"
                                 f" {summary}")


def module_path(m: str | Path) -> Path:
    if isinstance(m, Path):
        return m
    if m.startswith("example:"):
        p = EXAMPLES_DIR / m.split(":", 1)[1]
    else:
        p = _modules_dir / m
    if not (p / "oarbank-module.toml").is_file():
        raise ValueError(f"no module at {p} (no oarbank-module.toml)")
    return p


def _short(v: Any, n: int = 400) -> str:
    s = repr(v)
    return s if len(s) <= n else s[:n] + "..."
