"""The report: report.json fields and the Markdown table (scenario x backend)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.e2e.report import REPORT_VERSION, Report, Result


def _report() -> Report:
    r = Report(started=1000.0)
    r.results = [
        Result("idle-stop", "local", True, 12.34, ["3 jobs succeeded", "row stopped"]),
        Result("idle-stop", "container:bookworm", False, 40.0, ["agent started"],
               "timed out | waiting\nfor the row"),
        Result("crash-loop", "local", True, 5.0, []),
    ]
    r.skipped_backends = {"container:trixie": "no Docker engine"}
    r.setup = {"container:bookworm": {"project_built_s": 9.1}}
    r.finished = 1100.0
    return r


def test_json_has_every_result_with_outcome_seconds_and_evidence(tmp_path: Path) -> None:
    j, m = _report().write(tmp_path / "out")
    data = json.loads(j.read_text())
    assert data["version"] == REPORT_VERSION
    assert data["ok"] is False and data["passed"] == 2 and data["failed"] == 1
    assert data["total_s"] == 100.0
    cell = data["results"][1]
    assert cell["scenario"] == "idle-stop" and cell["backend"] == "container:bookworm"
    assert cell["outcome"] == "failed" and cell["seconds"] == 40.0
    assert cell["error"].startswith("timed out")
    assert data["results"][0]["evidence"] == ["3 jobs succeeded", "row stopped"]
    assert data["skipped_backends"] == {"container:trixie": "no Docker engine"}
    assert data["setup"]["container:bookworm"]["project_built_s"] == 9.1
    assert m.name == "report.md" and m.is_file()


def test_markdown_table_is_scenario_by_backend() -> None:
    md = _report().to_markdown()
    lines = md.splitlines()
    header = lines.index("| scenario | local | container:bookworm |")
    assert lines[header + 1] == "|---|---|---|"
    assert lines[header + 2] == "| idle-stop | passed (12.3 s) | failed (40.0 s) |"
    assert lines[header + 3] == "| crash-loop | passed (5.0 s) | — |"
    assert "- `container:trixie`: no Docker engine" in md
    # A failure's text cannot break the Markdown: pipes escaped, newlines kept on one line.
    assert "**Failure:** timed out \\| waiting ⏎ for the row" in md
    assert "- (no evidence recorded)" in md


def test_an_empty_report_is_not_ok() -> None:
    assert Report().ok is False
    r = Report()
    r.results = [Result("x", "local", True, 1.0)]
    assert r.ok is True


def test_markdown_lists_every_sandbox_wall_per_backend(tmp_path: Path) -> None:
    r = _report()
    r.results[0].sandbox = {"landlock_fs": "enforced", "caps_dropped": "enforced",
                            "mode": "auto"}
    r.results[1].sandbox = {"landlock_fs": "unavailable", "caps_dropped": "enforced",
                            "mode": "auto"}
    j, m = r.write(tmp_path / "out")
    text = m.read_text()
    assert "## Sandbox walls" in text
    assert "| wall | local | container:bookworm |" in text
    assert "| landlock_fs | enforced | unavailable |" in text
    assert "| caps_dropped | enforced | enforced |" in text
    assert json.loads(j.read_text())["results"][0]["sandbox"]["landlock_fs"] == "enforced"
