"""Each package README's "Layout" section maps every source file of its package to one
sentence: a file missing from the table, a row naming a file that does not exist, a row twice
or a row without its sentence fails here, naming the README and the file.

Source files are every file git tracks or would track (ignored build output left out) under the
folder a README describes, but for its README files and the folders another README describes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

AGENT_FOLDERS = ("broker", "fleet", "host", "jobs", "keep", "modules", "operate", "platform",
                 "protection", "reporting", "sandbox", "services")
UI_FOLDERS = ("dispatch", "ingest", "pages", "queries", "store", "web")
HARNESS_FOLDERS = ("bench", "e2e", "nodes", "tools")
# README -> (the folder its table describes, subfolders described elsewhere).
LAYOUTS = {
    "sdk/README.md": ("sdk/src/oarbank_sdk", ("sandbox",)),
    "sdk/src/oarbank_sdk/sandbox/README.md": ("sdk/src/oarbank_sdk/sandbox", ()),
    "agent/README.md": ("agent/src/oarbank_agent", AGENT_FOLDERS),
    "agent/src/oarbank_agent/broker/README.md": ("agent/src/oarbank_agent/broker", ()),
    "agent/src/oarbank_agent/fleet/README.md": ("agent/src/oarbank_agent/fleet", ()),
    "agent/src/oarbank_agent/host/README.md": ("agent/src/oarbank_agent/host", ()),
    "agent/src/oarbank_agent/jobs/README.md": ("agent/src/oarbank_agent/jobs", ()),
    "agent/src/oarbank_agent/keep/README.md": ("agent/src/oarbank_agent/keep", ()),
    "agent/src/oarbank_agent/modules/README.md": ("agent/src/oarbank_agent/modules", ()),
    "agent/src/oarbank_agent/operate/README.md": ("agent/src/oarbank_agent/operate", ()),
    "agent/src/oarbank_agent/platform/README.md": ("agent/src/oarbank_agent/platform",
                                                   ("linux/factory",)),
    "agent/src/oarbank_agent/platform/linux/factory/README.md": (
        "agent/src/oarbank_agent/platform/linux/factory", ()),
    "agent/src/oarbank_agent/protection/README.md": ("agent/src/oarbank_agent/protection", ()),
    "agent/src/oarbank_agent/reporting/README.md": ("agent/src/oarbank_agent/reporting", ()),
    "agent/src/oarbank_agent/sandbox/README.md": ("agent/src/oarbank_agent/sandbox", ()),
    "agent/src/oarbank_agent/services/README.md": ("agent/src/oarbank_agent/services", ()),
    "ui-pages/README.md": ("ui-pages/src/oarbank_ui", UI_FOLDERS),
    "ui-pages/src/oarbank_ui/dispatch/README.md": ("ui-pages/src/oarbank_ui/dispatch", ()),
    "ui-pages/src/oarbank_ui/ingest/README.md": ("ui-pages/src/oarbank_ui/ingest", ()),
    "ui-pages/src/oarbank_ui/pages/README.md": ("ui-pages/src/oarbank_ui/pages", ()),
    "ui-pages/src/oarbank_ui/queries/README.md": ("ui-pages/src/oarbank_ui/queries", ()),
    "ui-pages/src/oarbank_ui/store/README.md": ("ui-pages/src/oarbank_ui/store", ()),
    "ui-pages/src/oarbank_ui/web/README.md": ("ui-pages/src/oarbank_ui/web", ()),
    "harness/README.md": ("harness", ("tests", *HARNESS_FOLDERS)),
    "harness/bench/README.md": ("harness/bench", ()),
    "harness/e2e/README.md": ("harness/e2e", ()),
    "harness/nodes/README.md": ("harness/nodes", ()),
    "harness/tools/README.md": ("harness/tools", ()),
}

HEADING = re.compile(r"^(#{2,6}) Layout\s*$", re.MULTILINE)
ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")


def source_files(root: Path, skip: tuple[str, ...]) -> set[str]:
    """Paths relative to ``root`` of the files git tracks or would track there."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", str(root)], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout
    files = set()
    for name in filter(None, out.split("\0")):
        rel = (REPO / name).relative_to(root).as_posix()
        elsewhere = any(rel == s or rel.startswith(s + "/") for s in skip)
        if (REPO / name).is_file() and not rel.endswith(".md") and not elsewhere:
            files.add(rel)
    return files


def layout_rows(text: str) -> tuple[list[tuple[str, str]], str | None]:
    """The (path, sentence) rows of the Layout section, or why there are none."""
    m = HEADING.search(text)
    if m is None:
        return [], 'no "Layout" section'
    level = len(m.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", re.MULTILINE).search(text, m.end())
    section = text[m.end():end.start() if end else len(text)]
    rows = []
    for line in section.splitlines():
        row = ROW.match(line.strip())
        if row:
            rows.append((row.group(1).strip(), row.group(2).strip()))
    return rows, None if rows else "the Layout section has no table rows"


def layout_problems(readme: Path, root: Path, sources: set[str]) -> list[str]:
    """What is wrong with ``readme``'s table for the files ``sources`` under ``root``."""
    rows, why = layout_rows(readme.read_text(encoding="utf-8"))
    if why:
        return [why]
    problems = []
    seen: set[str] = set()
    for path, sentence in rows:
        if path in seen:
            problems.append(f"{path}: listed twice")
        seen.add(path)
        if not (root / path).is_file():
            problems.append(f"{path}: listed, but there is no such file under {root.name}/")
        if len(sentence.strip(" |")) < 3:
            problems.append(f"{path}: no sentence saying what it is")
    problems += [f"{path}: not in the Layout table" for path in
                 sorted(sources - seen)]
    return problems


@pytest.mark.parametrize("readme", sorted(LAYOUTS))
def test_layout_table_maps_every_source_file(readme: str) -> None:
    folder, skip = LAYOUTS[readme]
    root = REPO / folder
    problems = layout_problems(REPO / readme, root, source_files(root, skip))
    assert not problems, f"{readme} (folder {folder}):\n  " + "\n  ".join(problems)


def test_the_check_names_a_missing_file_an_unknown_one_and_a_bare_row(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    for name in ("a.py", "b.py", "sub/c.py"):
        (root / name).write_text("")
    readme = tmp_path / "README.md"
    readme.write_text("# pkg\n\n## Layout\n\n| file | what |\n|---|---|\n"
                      "| `a.py` | the first. |\n| `gone.py` | a file that left. |\n"
                      "| `sub/c.py` |  |\n| `a.py` | again. |\n\n## Next\n\n"
                      "| `b.py` | outside the section. |\n")
    assert layout_problems(readme, root, {"a.py", "b.py", "sub/c.py"}) == [
        "gone.py: listed, but there is no such file under pkg/",
        "sub/c.py: no sentence saying what it is",
        "a.py: listed twice",
        "b.py: not in the Layout table",
    ]
    readme.write_text("# pkg\n\nNo table.\n")
    assert layout_problems(readme, root, {"a.py"}) == ['no "Layout" section']
