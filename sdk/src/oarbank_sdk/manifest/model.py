"""The parsed manifest: frozen dataclasses, defaults from contract section 1.

Public through ``oarbank_sdk.manifest``; this module only holds the shapes so that the
checker (``manifest.checker``) and the public module can both import them without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..environments import service_env_name

__all__ = [
    "MANIFEST_FILE",
    "Gpu",
    "Manifest",
    "ManifestError",
    "Note",
    "Problem",
    "Restart",
    "Runner",
    "Service",
    "Stage",
    "UiEntry",
    "LIFECYCLES",
    "IDLE_TIMEOUT_S",
    "START_TIMEOUT_S",
    "STOP_TIMEOUT_S",
    "BACKOFF_INITIAL_S",
    "BACKOFF_MAX_S",
    "MAX_FAILURES",
    "STAGE_TIMEOUT_S",
    "MAX_ATTEMPTS",
    "STOP_GRACE_S",
]

MANIFEST_FILE = "oarbank-module.toml"
LIFECYCLES = ("on_demand", "always", "manual")

# Contract section 1's defaults, written once: the dataclasses below and the checker (which
# fills in a key that is absent) both read them.
IDLE_TIMEOUT_S = 900.0
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 120.0
BACKOFF_INITIAL_S = 10.0
BACKOFF_MAX_S = 600.0
MAX_FAILURES = 5
STAGE_TIMEOUT_S = 1800.0
MAX_ATTEMPTS = 3
STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class Problem:
    """One thing wrong, at a key path such as ``services[0].endpoint``."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass(frozen=True)
class Note:
    """A key or source accepted without being acted on (upstream's platform defines it): the
    ``message`` says whose it is and what this project does instead. Never an error."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


class ManifestError(Exception):
    """A manifest that cannot be used; ``problems`` lists every problem found, in file order."""

    def __init__(self, path: Path, problems: list[Problem]) -> None:
        self.path = path
        self.problems = list(problems)
        super().__init__(str(self))

    def __str__(self) -> str:
        lines = [f"{self.path}: INVALID"]
        lines.extend(str(p) for p in self.problems)
        return "\n".join(lines)


@dataclass(frozen=True)
class Gpu:
    use: str = "none"  # none | shared | exclusive
    apis_any: tuple[str, ...] = ()


@dataclass(frozen=True)
class Restart:
    backoff_initial_s: float = BACKOFF_INITIAL_S
    backoff_max_s: float = BACKOFF_MAX_S
    max_failures: int = MAX_FAILURES


@dataclass(frozen=True)
class Service:
    name: str
    exec: tuple[str, ...]
    lifecycle: str = "on_demand"  # on_demand | always | manual
    idle_timeout_s: float = IDLE_TIMEOUT_S
    start_timeout_s: float = START_TIMEOUT_S
    stop_timeout_s: float = STOP_TIMEOUT_S
    restart: Restart = field(default_factory=Restart)
    endpoint: bool = False
    pools: tuple[str, ...] = ()  # provides.pools
    capabilities: tuple[str, ...] = ()  # provides.capabilities
    reserves_host_memory: bool = False
    yieldable: bool = True
    gpu: Gpu = field(default_factory=Gpu)
    # Beyond apis.md (compatible additions, defaults keep old call sites working):
    platforms: tuple[str, ...] = ()
    freeze_ok: bool | None = None

    @property
    def env_name(self) -> str:
        """The connector's environment variable for jobs: ``OARBANK_SERVICE_<NAME>``."""
        return service_env_name(self.name)


@dataclass(frozen=True)
class Stage:
    name: str
    timeout_s: float = STAGE_TIMEOUT_S
    pools: dict[str, int] = field(default_factory=dict)  # requires.pools
    needs_pools: tuple[str, ...] = ()  # requires.needs_pools
    cpu: float | None = None  # requires.resources.cpu
    mem_gb: float | None = None  # requires.resources.mem_gb
    max_attempts: int = MAX_ATTEMPTS  # retry.max_attempts
    # Beyond apis.md:
    capabilities: tuple[str, ...] = ()  # requires.capabilities
    platforms: tuple[str, ...] = ()  # requires.platforms


@dataclass(frozen=True)
class Runner:
    exec: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    stop_grace_s: float = STOP_GRACE_S


@dataclass(frozen=True)
class UiEntry:
    id: str
    title: str
    slot: str
    file: str  # relative to the bundle, as written in the manifest


@dataclass(frozen=True)
class Manifest:
    path: Path  # the toml file
    bundle: Path  # absolute folder holding it
    id: str
    version: str
    description: str
    runner: Runner | None
    stages: tuple[Stage, ...]
    services: tuple[Service, ...]
    pages: tuple[UiEntry, ...]
    panels: tuple[UiEntry, ...]
    sandbox: dict[str, Any]  # raw [sandbox] table
    raw: dict[str, Any]  # the whole parsed document
    # Keys accepted but not acted on, one note each (``Note``), in the order checked.
    notes: tuple[Note, ...] = ()

    @property
    def short_name(self) -> str:
        return self.id.rsplit(".", 1)[-1]

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def service(self, name: str) -> Service | None:
        return next((s for s in self.services if s.name == name), None)

    def service_for_pool(self, pool: str) -> Service | None:
        return next((s for s in self.services if pool in s.pools), None)
