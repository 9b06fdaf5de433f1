"""The modules a portal serves pages for: manifests loaded with ``oarbank_sdk.manifest.load``,
and their page and panel files read (and checked) on every render so an author's edit shows on
the next refresh.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oarbank_sdk.manifest import Manifest, ManifestError, Problem, UiEntry, load
from oarbank_sdk.pages import check_page_data

__all__ = ["ManifestError", "PageFileError", "PortalModule", "find_module", "load_modules"]


class PageFileError(Exception):
    """A page or panel file that cannot be read or is not JSON; the message names the file."""


@dataclass(frozen=True)
class PortalModule:
    manifest: Manifest

    @property
    def id(self) -> str:
        return self.manifest.id

    @property
    def short_name(self) -> str:
        return self.manifest.short_name

    @property
    def names(self) -> tuple[str, ...]:
        """The names heartbeat rows may carry for this module (its id, and its short name)."""
        return (self.id, self.short_name)

    def entry(self, kind: str, entry_id: str) -> UiEntry | None:
        entries = self.manifest.pages if kind == "page" else self.manifest.panels
        return next((e for e in entries if e.id == entry_id), None)

    def read(self, kind: str, entry: UiEntry) -> tuple[Any, list[Problem]]:
        """The parsed document and the SDK checker's problems (shown, never fatal)."""
        path = self.manifest.bundle / entry.file
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PageFileError(f"{entry.file}: {kind} file does not exist in {self.id}")
        except (OSError, UnicodeDecodeError) as e:
            raise PageFileError(f"{entry.file}: cannot read the {kind} file: {e}")
        except json.JSONDecodeError as e:
            raise PageFileError(f"{entry.file}: not valid JSON at line {e.lineno}, "
                                f"column {e.colno}: {e.msg}")
        problems = check_page_data(doc, kind, entry.file)
        return doc, problems


def load_modules(dirs: list[str | Path]) -> dict[str, PortalModule]:
    """Modules by id. Raises ``ManifestError`` for an invalid manifest and ``ValueError`` when
    two folders declare the same module id."""
    out: dict[str, PortalModule] = {}
    for d in dirs:
        m = PortalModule(load(d))
        if m.id in out:
            raise ValueError(f"{d}: module {m.id} is already loaded from "
                             f"{out[m.id].manifest.bundle}")
        out[m.id] = m
    return out


def find_module(modules: dict[str, PortalModule], name: str) -> PortalModule | None:
    """A module by id or, when unambiguous, by short name."""
    if name in modules:
        return modules[name]
    by_short = [m for m in modules.values() if m.short_name == name]
    return by_short[0] if len(by_short) == 1 else None

