"""`oarbank-portal preview`: a module's pages from its fixtures, as static HTML."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "modelserver"


def preview(module: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "preview", str(module),
                           "--out", str(out), *extra], capture_output=True, text=True,
                          timeout=60)


def test_preview_of_the_example(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = preview(EXAMPLE, out)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # the example's pages pass the SDK's page checks
    written = {Path(line).name for line in r.stdout.split()}
    assert written == {"index.html", "page-overview.html", "panel-node.html"}
    page = (out / "page-overview.html").read_text()
    for text in ("node-a", "gpu-04", "held: preempt_memory", "starting"):
        assert text in page
    assert "portal.js" not in page  # static: nothing to refresh from
    panel = (out / "panel-node.html").read_text()
    assert "node node-a" in panel  # the first node in the fixtures
    assert (out / "static" / "portal.css").is_file()
    assert 'href="page-overview.html"' in (out / "index.html").read_text()


def test_preview_panel_for_a_chosen_node(tmp_path: Path) -> None:
    r = preview(EXAMPLE, tmp_path / "out", "--node", "node-b")
    assert r.returncode == 0, r.stderr
    panel = (tmp_path / "out" / "panel-node.html").read_text()
    assert "idle" in panel and "node node-b" in panel


def test_preview_without_fixture_shows_data_unavailable(tmp_path: Path) -> None:
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    (mod / "fixtures" / "ui" / "queries" / "services.json").unlink()
    r = preview(mod, tmp_path / "out")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "out" / "page-overview.html").read_text()
    assert "data unavailable" in page
    assert "no fixture fixtures/ui/queries/services.json" in page


def test_preview_reports_page_problems(tmp_path: Path) -> None:
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    page = mod / "ui" / "pages" / "overview.json"
    page.write_text(page.read_text().replace('"requires": "1.2", ', ""))
    r = preview(mod, tmp_path / "out")
    assert r.returncode == 0
    assert "ui/pages/overview.json: body[3].source.query" in r.stderr
    assert "requires" in r.stderr


def test_preview_of_an_invalid_module(tmp_path: Path) -> None:
    r = preview(tmp_path, tmp_path / "out")
    assert r.returncode == 2
    assert "oarbank-module.toml" in r.stderr


def test_relative_fixture_times_render_relative_to_now(tmp_path: Path) -> None:
    # The example's fixtures say "-4s", "-6s", "-2s", "-3m": a preview made any day reads
    # seconds and minutes ago, never "333 d ago".
    out = tmp_path / "out"
    r = preview(EXAMPLE, out)
    assert r.returncode == 0, r.stderr
    page = (out / "page-overview.html").read_text()
    for ago in ("4 s ago", "6 s ago", "2 s ago", "3 min ago"):
        assert ago in page, ago
    assert " d ago" not in page


def test_fixture_times_resolve_only_relative_values() -> None:
    from oarbank_ui.queries.times import resolve_rows

    rows = [{"a": "-5m", "b": "-1.5h", "c": "now", "d": "-2d", "e": "5m", "f": "-5x", "g": 3}]
    assert resolve_rows(rows, 1000000.0) == [{"a": 999700.0, "b": 994600.0, "c": 1000000.0,
                                              "d": 827200.0, "e": "5m", "f": "-5x", "g": 3}]
