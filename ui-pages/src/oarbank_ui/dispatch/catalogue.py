"""What the portal dispatches: the modules it serves (``serve --module``), each with its stages,
the pools each stage reserves and the service providing each pool (contract 10.2, 10.4).

A job names a module the portal has a manifest for: the manifest is what says which stages
exist. Built from the SDK's manifests; free of HTTP and of SQL.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from oarbank_sdk.manifest import Manifest

__all__ = ["Catalogue", "ModuleInfo"]


@dataclass(frozen=True)
class ModuleInfo:
    id: str
    stages: dict[str, dict[str, int]]  # stage -> {pool: tokens one job holds}
    pool_service: dict[str, str] = field(default_factory=dict)  # pool -> service providing it

    def stage_service(self, stage: str) -> str | None:
        """The service behind a stage's first pool (None: the stage reserves none)."""
        for pool in self.stages.get(stage, {}):
            return self.pool_service.get(pool)
        return None


class Catalogue:
    def __init__(self, modules: Iterable[ModuleInfo], aliases: dict[str, str] | None = None):
        self.modules = {m.id: m for m in modules}
        self.aliases = dict(aliases or {})  # short name -> id

    @classmethod
    def from_manifests(cls, manifests: Iterable[Manifest]) -> Catalogue:
        infos, aliases = [], {}
        for m in manifests:
            pools = {p: s.name for s in m.services for p in s.pools}
            infos.append(ModuleInfo(m.id, {st.name: dict(st.pools) for st in m.stages}, pools))
            aliases[m.short_name] = m.id
        return cls(infos, aliases)

    def resolve(self, name: str) -> ModuleInfo | None:
        """The module a job names, by id or short name."""
        found = self.modules.get(name)
        if found is None and name in self.aliases:
            found = self.modules.get(self.aliases[name])
        return found

    def names(self) -> list[str]:
        return sorted(self.modules)
