"""The repository's markdown stands on its own: every relative link resolves to a file or folder
inside the repository, and nothing points outside it (no planning-repository paths such as
the old spec location, no absolute checkout paths)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]

# Inline links and images: [text](target "title") / ![alt](<target>)
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
# Reference definitions: [label]: target
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
FENCE = re.compile(r"^\s{0,3}(```|~~~).*?^\s{0,3}\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")

# What no file may mention: the spec's old home outside the repository, and absolute paths of
# a checkout (the author's machine).
FORBIDDEN = [
    ("shared/spec", re.compile(r"shared/spec")),
    ("../shared", re.compile(r"\.\./shared\b")),
    ("an absolute /work/ path", re.compile(r"(?<![\w.~-])/work/")),
]


def tracked_markdown() -> list[Path]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    out = subprocess.run(["git", "ls-files", "-z", "--", "*.md"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    files = [REPO / name for name in out.split("\0") if name]
    return [f for f in files if f.is_file()]  # a file deleted in the working tree is not read


def link_targets(text: str) -> list[str]:
    """Link targets outside code blocks and code spans (code is shown, never followed)."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    return INLINE_LINK.findall(prose) + REFERENCE_DEF.findall(prose)


def broken_links(md: Path) -> list[str]:
    problems = []
    for target in link_targets(md.read_text(encoding="utf-8")):
        if not target or target.startswith("#") or SCHEME.match(target) or target.startswith("//"):
            continue
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if path.startswith("/"):
            problems.append(f"{target}: absolute link (write it relative to the file)")
            continue
        resolved = (md.parent / path).resolve()
        if not resolved.is_relative_to(REPO):
            problems.append(f"{target}: points outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
    return problems


def test_link_extraction_skips_code_and_reads_both_link_forms() -> None:
    text = ("see [a](docs/a.md#x) and ![img](<img/b.png> \"t\"), `[c](nope.md)`\n"
            "```\n[d](nope2.md)\n```\n[ref]: ../up.md\n[e](https://example.com)\n")
    assert link_targets(text) == ["docs/a.md#x", "img/b.png", "https://example.com", "../up.md"]


def test_every_relative_link_in_the_markdown_resolves() -> None:
    problems = [f"{md.relative_to(REPO)}: {p}" for md in tracked_markdown() for p in broken_links(md)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_no_markdown_points_outside_the_repository() -> None:
    problems = []
    for md in tracked_markdown():
        for lineno, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
            for what, pattern in FORBIDDEN:
                if pattern.search(line):
                    problems.append(f"{md.relative_to(REPO)}:{lineno}: mentions {what}: {line.strip()}")
    assert not problems, "\n".join(problems)
