"""The parsed manifest: frozen dataclasses, defaults from contract section 1.

Public through ``oarbank_sdk.manifest``; this module only holds the shapes so that the
checker (``manifest.checker``) and the public module can both import them without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "MANIFEST_FILE",
    "Gpu",
    "Manifest",
    "ManifestError",
    "Problem",
    "Restart",
    "Runner",
    "Service",
    "Stage",
    "UiEntry",
]

MANIFEST_FILE = "oarbank-module.toml"


@dataclass(frozen=True)
class Problem:
    """One thing wrong, at a key path such as ``services[0].endpoint``."""

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
    backoff_initial_s: float = 10
    backoff_max_s: float = 600
    max_failures: int = 5


@dataclass(frozen=True)
class Service:
    name: str
    exec: tuple[str, ...]
    lifecycle: str = "on_demand"  # on_demand | always | manual
    idle_timeout_s: float = 900.0
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 120.0
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
        return "OARBANK_SERVICE_" + self.name.upper()


@dataclass(frozen=True)
class Stage:
    name: str
    timeout_s: float = 1800.0
    pools: dict[str, int] = field(default_factory=dict)  # requires.pools
    needs_pools: tuple[str, ...] = ()  # requires.needs_pools
    cpu: float | None = None  # requires.resources.cpu
    mem_gb: float | None = None  # requires.resources.mem_gb
    max_attempts: int = 3  # retry.max_attempts
    # Beyond apis.md:
    capabilities: tuple[str, ...] = ()  # requires.capabilities
    platforms: tuple[str, ...] = ()  # requires.platforms


@dataclass(frozen=True)
class Runner:
    exec: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    stop_grace_s: float = 20.0


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

    @property
    def short_name(self) -> str:
        return self.id.rsplit(".", 1)[-1]

    def stage(self, name: str) -> Stage | None:
        return next((s for s in self.stages if s.name == name), None)

    def service(self, name: str) -> Service | None:
        return next((s for s in self.services if s.name == name), None)

    def service_for_pool(self, pool: str) -> Service | None:
        return next((s for s in self.services if pool in s.pools), None)
