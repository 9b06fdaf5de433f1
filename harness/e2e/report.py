"""The run's report: `report.json` (machine-readable) and `report.md` (a scenario x backend
table). Pure: results in, text out; `write` is the only I/O."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Result", "Report", "REPORT_VERSION"]

REPORT_VERSION = 1


@dataclass
class Result:
    scenario: str
    backend: str  # e.g. "local", "container:bookworm"
    passed: bool
    seconds: float
    evidence: list[str] = field(default_factory=list)  # what was seen, in order
    error: str | None = None  # why it failed (None when passed)
    # The agent's sandbox walls on this backend (`status` -> sandbox: wall -> enforced |
    # unavailable, plus mode); None when no agent answered.
    sandbox: dict[str, str] | None = None

    @property
    def outcome(self) -> str:
        return "passed" if self.passed else "failed"


@dataclass
class Report:
    started: float = field(default_factory=time.time)
    finished: float | None = None
    results: list[Result] = field(default_factory=list)
    skipped_backends: dict[str, str] = field(default_factory=dict)  # backend -> why not here
    setup: dict[str, Any] = field(default_factory=dict)  # e.g. image build times

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    def to_json(self) -> dict[str, Any]:
        total = (self.finished or time.time()) - self.started
        return {
            "version": REPORT_VERSION,
            "started": self.started,
            "finished": self.finished,
            "total_s": round(total, 3),
            "ok": self.ok,
            "passed": sum(r.passed for r in self.results),
            "failed": sum(not r.passed for r in self.results),
            "results": [
                {**asdict(r), "seconds": round(r.seconds, 3), "outcome": r.outcome}
                for r in self.results
            ],
            "skipped_backends": dict(self.skipped_backends),
            "setup": self.setup,
        }

    def to_markdown(self) -> str:
        backends = list(dict.fromkeys(r.backend for r in self.results))
        scenarios = list(dict.fromkeys(r.scenario for r in self.results))
        by = {(r.scenario, r.backend): r for r in self.results}
        lines = ["# e2e report", ""]
        total = (self.finished or time.time()) - self.started
        npass = sum(r.passed for r in self.results)
        lines.append(f"{npass} of {len(self.results)} passed in {total:.1f} s.")
        lines.append("")
        lines.append("| scenario | " + " | ".join(backends) + " |")
        lines.append("|---|" + "---|" * len(backends))
        for s in scenarios:
            cells = []
            for b in backends:
                r = by.get((s, b))
                cells.append("—" if r is None else f"{r.outcome} ({r.seconds:.1f} s)")
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        if self.skipped_backends:
            lines += ["", "Backends not run here:", ""]
            lines += [f"- `{b}`: {why}" for b, why in self.skipped_backends.items()]
        walls = {}
        for r in self.results:
            if r.sandbox and r.backend not in walls:
                walls[r.backend] = r.sandbox
        if walls:
            names = list(dict.fromkeys(k for sb in walls.values() for k in sb))
            lines += ["", "## Sandbox walls (the agent's status on each backend)", "",
                      "| wall | " + " | ".join(walls) + " |", "|---|" + "---|" * len(walls)]
            lines += [f"| {n} | " + " | ".join(_md(str(sb.get(n, "—"))) for sb in walls.values())
                      + " |" for n in names]
        lines += ["", "## Evidence", ""]
        for r in self.results:
            lines.append(f"### {r.scenario} on {r.backend}: {r.outcome}")
            lines.append("")
            if r.error:
                lines.append(f"**Failure:** {_md(r.error)}")
                lines.append("")
            lines += [f"- {_md(e)}" for e in r.evidence] or ["- (no evidence recorded)"]
            lines.append("")
        return "\n".join(lines)

    def write(self, out: Path) -> tuple[Path, Path]:
        out.mkdir(parents=True, exist_ok=True)
        j, m = out / "report.json", out / "report.md"
        j.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        m.write_text(self.to_markdown() + "\n", encoding="utf-8")
        return j, m


def _md(text: str) -> str:
    # Keep one evidence item on one line of the list and the table intact.
    return text.replace("\r", " ").replace("\n", " ⏎ ").replace("|", "\\|")
