"""The conformance kit's report: one line per check, a summary, or JSON.

``note`` adds lines that are not checks (a failing service's log tail, where a kept data
folder is): printed indented under the checks in text mode, listed under ``notes`` in JSON."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TextIO

__all__ = ["Check", "Report", "OK", "FAIL", "SKIP", "WARN"]

OK, FAIL, SKIP, WARN = "ok", "FAIL", "skip", "warn"


@dataclass(frozen=True)
class Check:
    status: str  # ok / FAIL / skip / warn
    name: str
    detail: str = ""

    def line(self) -> str:
        return f"{self.status:<4} {self.name}" + (f": {self.detail}" if self.detail else "")


@dataclass
class Report:
    module_dir: str
    stream: TextIO | None = None  # lines are printed here as checks complete (text mode)
    module_id: str = "?"
    version: str = "?"
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def add(self, status: str, name: str, detail: str = "") -> Check:
        check = Check(status, name, " ".join(detail.split()))  # one line, whatever detail holds
        self.checks.append(check)
        if self.stream is not None:
            print(check.line(), file=self.stream, flush=True)
        return check

    def note(self, lines: list[str]) -> None:
        self.notes.extend(lines)
        if self.stream is not None:
            for line in lines:
                print(f"     | {line}", file=self.stream, flush=True)

    def count(self, status: str) -> int:
        return sum(1 for c in self.checks if c.status == status)

    @property
    def failed(self) -> int:
        return self.count(FAIL)

    def summary(self) -> str:
        # Before the manifest is read there is no id: the folder names the module.
        who = self.module_dir if self.module_id == "?" else f"{self.module_id} {self.version}"
        return (f"{who}: {self.count(OK)} passed, {self.failed} failed, "
                f"{self.count(SKIP)} skipped")

    def to_json(self) -> str:
        return json.dumps({
            "module_dir": self.module_dir,
            "module": self.module_id,
            "version": self.version,
            "passed": self.count(OK),
            "failed": self.failed,
            "skipped": self.count(SKIP),
            "warnings": self.count(WARN),
            "wall_s": round(self.wall_s, 3),
            "checks": [asdict(c) for c in self.checks],
            "notes": self.notes,
        }, indent=2)
