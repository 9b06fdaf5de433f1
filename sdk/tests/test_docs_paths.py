"""Every repository path a doc names exists. The docs are each tracked Markdown file and each
docstring (module, class, function) of each tracked Python file; a miss fails naming the file it
was found in. Relative links are test_docs_links.py's; this test reads what is written as code.

What counts as a repository path (``candidates``), in a code span (`x` or ``x``), one word at a
time, or written plainly when it starts at the repository's top:

- a word with a ``/`` whose first part is a top-level entry of the repository (``agent/...``,
  ``docs/...``, ``.ci/run``): it resolves from the repository root or the doc's folder;
- a word with a ``/`` ending in a file extension below (``jobs/run.py``, ``factory/child.py``):
  it resolves from the doc's folder or one above it, is the end of a tracked path, or is a path
  in a module's layout (resolved in the reference module, examples/modelserver);
- a bare ``<name>.py``: some tracked file has that name; after `` :: `` (``<name>.py :: a, B.c``), the
  names the file is said to hold: each must be in it (``c`` for ``B.c``);
- a dotted module path from one of our packages (``oarbank_agent.jobs.run``, with an attribute
  after the module: ``oarbank_sdk.manifest.load``): the module exists and names the attribute.

Not paths, so never checked (``NOT_A_PATH``, each with why): URLs and other schemes, absolute
paths (on a node, in a container: ``/etc/oarbank``), placeholders (``<state>/procs``, ``W/``),
globs, and what git ignores (``.bench/results.json``: output, not source). A word with a ``/``
that is neither rooted nor ends in an extension (``SIGTERM/SIGINT``, ``application/json``) is
prose, not a path.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

EXTENSIONS = frozenset({"py", "md", "toml", "json", "jsonl", "yml", "yaml", "sh", "cfg", "txt",
                        "ini", "html", "css", "js", "cjs", "service", "sql", "svg", "png"})
# Our importable packages, for dotted module paths.
MODULES = {"oarbank_agent": "agent/src/oarbank_agent", "oarbank_sdk": "sdk/src/oarbank_sdk",
           "oarbank_ui": "ui-pages/src/oarbank_ui", "harness": "harness",
           "testsupport": "testsupport"}
# The reference module: a path in a module's layout (ui/pages/overview.json) resolves there.
REFERENCE_MODULE = "examples/modelserver"
# Docs that say, at their top, that they shorten the packages' source folders.
SHORTHAND = {
    "docs/contract-map.md": {"sdk/": "sdk/src/oarbank_sdk/", "agent/": "agent/src/oarbank_agent/",
                             "ui/": "ui-pages/src/oarbank_ui/"},
}

NOT_A_PATH = (
    ("a URL or another scheme (unix:/run/x.sock)", re.compile(r"^[A-Za-z][A-Za-z0-9+-]*:(?!:)")),
    ("an absolute path: on a node or in a container", re.compile(r"^[/~$\\]|^[A-Z]:\\")),
    ("a placeholder (<state>/procs, W/result.json, {name})", re.compile(
        r"[<>{}]|(^|/)[A-Z][A-Z0-9_]*(/|$)")),
    ("a glob", re.compile(r"[*?\[\]]")),
)

CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
WORD = re.compile(r"[\w./:<>{}*?\[\]~$\\-]+")
TRAILER = re.compile(r"(::.*|:\d+(-\d+)?|#.*)$")  # file :: name, file:12, file#anchor
DOTTED = re.compile(r"[a-z_]+(\.[A-Za-z_]\w*)+")


@dataclass(frozen=True)
class Tree:
    """What the check resolves against: the tracked files and folders, relative to the root."""

    root: Path
    files: frozenset[str]

    @cached_property
    def top(self) -> frozenset[str]:
        return frozenset(f.split("/", 1)[0] for f in self.files)

    @cached_property
    def names(self) -> frozenset[str]:
        return frozenset(f.rsplit("/", 1)[-1] for f in self.files)

    @cached_property
    def folders(self) -> frozenset[str]:
        return frozenset(f.rsplit("/", i)[0] for f in self.files for i in range(1, f.count("/") + 1))

    def exists(self, rel: str) -> bool:
        rel = rel.rstrip("/")
        return rel in self.files or rel in self.folders

    def ends_a_path(self, rel: str) -> list[str]:
        """The files, or a folder, whose path ends with ``rel``."""
        tail = "/" + rel.rstrip("/")
        return [f for f in self.files if f.endswith(tail)] or [
            d for d in self.folders if ("/" + d).endswith(tail)][:1]


def plain_paths(top: frozenset[str]) -> re.Pattern[str]:
    """Paths written without backticks: from a top-level entry, ending in an extension or /."""
    tops = "|".join(re.escape(t) for t in sorted(top, key=len, reverse=True) if "/" not in t)
    ext = "|".join(sorted(EXTENSIONS))
    return re.compile(rf"(?<![\w./<$~-])((?:{tops})/(?:[\w./-]*?(?:\.(?:{ext})|/))?)(?![\w*<{{-])")


@dataclass(frozen=True)
class Ref:
    """A path a doc names, and the names it says the file holds (``<name>.py :: a, B.c``)."""

    path: str
    names: tuple[str, ...] = ()


def names_after(tail: str) -> tuple[str, ...]:
    """The identifiers of ``<name>.py :: a, B.c (why)``: the last part of each dotted name."""
    names = []
    for item in re.split(r"[,;]|\band\b", re.sub(r"\([^)]*\)?", "", tail)):
        name = item.strip().rstrip("()").split(".")[-1]
        if re.fullmatch(r"[A-Za-z_]\w*", name):
            names.append(name)
    return tuple(names)


def candidates(text: str, top: frozenset[str]) -> list[Ref]:
    """What ``text`` names: repository paths (with the names after ` :: `) and dotted modules."""
    found: list[tuple[str, bool, tuple[str, ...]]] = []  # (word, alone in its span, names)
    for span in CODE_SPAN.finditer(text):
        head, _, tail = span.group(2).partition(" :: ")  # `file :: name` names the file
        words = [w.rstrip(".:,;").lstrip(":,;") for w in WORD.findall(head.strip())]
        alone = len(head.split()) == 1
        for i, word in enumerate(words):
            # In a longer span (a command, an example) only paths from the top and -m modules.
            wanted = alone or "/" in word and word.split("/", 1)[0] in top or (
                i > 0 and words[i - 1] == "-m")
            if wanted and word and not any(p.search(word) for _, p in NOT_A_PATH):
                found.append((word, alone, names_after(tail) if alone else ()))
    found += [(w, False, ()) for w in plain_paths(top).findall(CODE_SPAN.sub(" ", text))]
    out = []
    for word, alone, names in found:
        path = TRAILER.sub("", word)
        last = path.rsplit("/", 1)[-1]
        if DOTTED.fullmatch(path) and path.rsplit(".", 1)[-1] not in EXTENSIONS:
            if path.split(".")[0] in MODULES:
                out.append(Ref(path))
        elif "/" in path and (path.split("/", 1)[0] in top
                              or "." in last and last.rsplit(".", 1)[-1] in EXTENSIONS):
            out.append(Ref(path, names if path.endswith(".py") else ()))
        elif alone and path.endswith(".py") and len(path) > 3:
            out.append(Ref(path, names))
    return out


def holds(tree: Tree, files: list[str], name: str) -> bool:
    return any(re.search(rf"\b{re.escape(name)}\b", (tree.root / f).read_text(encoding="utf-8"))
               for f in files)


def module_files(tree: Tree, dotted: str) -> tuple[list[str], tuple[str, ...]]:
    """The file a dotted path's module is in (a package's __init__.py) and the attribute after."""
    parts = dotted.split(".")
    here = MODULES[parts[0]]
    for i, part in enumerate(parts[1:], 1):
        if tree.exists(f"{here}/{part}") and f"{here}/{part}.py" not in tree.files:
            here = f"{here}/{part}"
        elif f"{here}/{part}.py" in tree.files:
            return [f"{here}/{part}.py"], tuple(parts[i + 1:i + 2])
        else:  # an attribute of the package itself
            init = f"{here}/__init__.py"
            return ([init] if init in tree.files else []), (part,)
    return [here], ()


def where(tree: Tree, doc: str, path: str) -> list[str]:
    """The tracked files (or folders) ``path``, named in ``doc``, may mean; none: a miss."""
    if "/" not in path:
        return [f for f in tree.files if f.rsplit("/", 1)[-1] == path]
    folder = doc.rsplit("/", 1)[0] if "/" in doc else ""
    bases = [folder]
    while bases[-1]:
        bases.append(bases[-1].rsplit("/", 1)[0] if "/" in bases[-1] else "")
    tries = [f"{b}/{path}" if b else path for b in bases]
    tries += [path.replace(short, full, 1) for short, full in SHORTHAND.get(doc, {}).items()
              if path.startswith(short)]
    rooted = path.split("/", 1)[0] in tree.top
    if not rooted:
        tries.append(f"{REFERENCE_MODULE}/{path}")
    root = tree.root.resolve()
    normal = []
    for t in tries:
        full = (root / t).resolve()
        if full.is_relative_to(root):
            normal.append(full.relative_to(root).as_posix())
    hits = [t for t in normal if tree.exists(t)]
    if hits or rooted:
        return hits
    return tree.ends_a_path(path)


def miss(tree: Tree, doc: str, ref: Ref) -> str | None:
    """Why ``ref`` does not resolve, or None."""
    if "/" not in ref.path and ref.path.rsplit(".", 1)[-1] not in EXTENSIONS:
        files, names = module_files(tree, ref.path)
        what = "no such module"
    else:
        files, names = where(tree, doc, ref.path), ref.names
        what = "no such file"
    if not files:
        return f"{ref.path}: {what}"
    files = [f for f in files if f in tree.files]
    gone = [n for n in names if files and not holds(tree, files, n)]
    return f"{ref.path}: no {', '.join(gone)} in it" if gone else None


def docstrings(source: str) -> Iterator[str]:
    """The docstrings of a module, its classes and functions (nested in any statement)."""
    todo: list[ast.AST] = [ast.parse(source)]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield doc
        for field in ("body", "orelse", "finalbody", "handlers"):
            todo += [n for n in getattr(node, field, ()) if isinstance(n, ast.AST)]


def doc_texts(tree: Tree) -> Iterator[tuple[str, str]]:
    for name in sorted(tree.files):
        if name.endswith(".md"):
            yield name, (tree.root / name).read_text(encoding="utf-8")
        elif name.endswith(".py"):
            for doc in docstrings((tree.root / name).read_text(encoding="utf-8")):
                yield name, doc


def ignored(paths: set[str]) -> set[str]:
    """Those of ``paths`` git ignores (output, not source); none without git (Windows'
    Python under Wine has none: the rules are then checked on a tree of their own)."""
    if not paths or shutil.which("git") is None:
        return set()
    out = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO,
                         input="\n".join(sorted(paths)), capture_output=True, text=True).stdout
    return set(out.split())


def misses(tree: Tree) -> list[str]:
    """``file: path: why`` for each path a doc names that does not resolve."""
    found = []
    top = tree.top
    for doc, text in doc_texts(tree):
        for ref in candidates(text, top):
            why = miss(tree, doc, ref)
            if why:
                found.append((doc, ref.path, why))
    skip = ignored({path for _, path, _ in found})
    return sorted({f"{doc}: {why}" for doc, path, why in found if path not in skip})


def tracked(root: Path) -> frozenset[str]:
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, check=True, capture_output=True, text=True).stdout
    return frozenset(n for n in out.split("\0") if n and (root / n).is_file())


def test_every_path_a_doc_names_exists() -> None:
    found = misses(Tree(REPO, tracked(REPO)))
    assert not found, (f"{len(found)} paths named in docs do not exist (file: path):\n  "
                       + "\n  ".join(found))


TOP = frozenset({"agent", "docs", "sdk", ".ci"})


@pytest.mark.parametrize(("text", "expected"), [
    ("see `agent/README.md` and ``jobs/run.py``", ["agent/README.md", "jobs/run.py"]),
    ("`agent/tests/test_x.py :: test_y`", ["agent/tests/test_x.py"]),
    ("`sdk/manifest/checker.py :: build` (`MODULE_ID`)", ["sdk/manifest/checker.py"]),
    ("`run.py:12` and ``store.py``", ["run.py", "store.py"]),
    ("`python -m oarbank_agent.operate.optiontable --write agent/README.md`",
     ["oarbank_agent.operate.optiontable", "agent/README.md"]),
    ("`.ci/run` runs it; ``oarbank_sdk.manifest.load``", [".ci/run", "oarbank_sdk.manifest.load"]),
    ("plainly, agent/src/x.py and docs/ too; not agent/tests/test_windows_*.py", [
        "agent/src/x.py", "docs/"]),
    ("`https://example.com/a.md`, `unix:/run/p.sock`", []),
    ("`/etc/oarbank/agent.toml`, `~/.venv/bin/x.py`, `C:\\oarbank\\state`", []),
    ("`<state>/procs`, `W/result.json`, `DIR/wheels`, `{name}.py`", []),
    ("`goldens/*.json`, `agent/tests/test_windows_*.py`", []),
    ("`SIGTERM/SIGINT`, `application/json`, `HTTP/1.1`, `3/8`", []),
    ("`result.json` and `README` are file names, not checked", []),
    ("`os.path.join`, `jobs.after_attempt`, `from oarbank_sdk.x import y`", []),
    ("a command's own files: `python -I script.py serve`, `--out preview/index.html`", []),
    ("`python -I x.py :: y`", []),
])
def test_what_counts_as_a_path(text: str, expected: list[str]) -> None:
    assert [ref.path for ref in candidates(text, TOP)] == expected


@pytest.mark.parametrize(("text", "names"), [
    ("`agent/jobs/run.py :: JobRuns._run`", ("_run",)),
    ("`ops.py :: last_json_line, run_op (the op)`", ("last_json_line", "run_op")),
    ("`x.py :: decide` and `y.py :: A.b, C`", ("decide",)),
    ("`sdk/x.py :: hand_over()`; `agent/y.py` (banner)", ("hand_over",)),
])
def test_the_names_a_file_is_said_to_hold(text: str, names: tuple[str, ...]) -> None:
    assert candidates(text, TOP)[0].names == names


def test_a_dead_path_is_named_with_the_file_it_is_in(tmp_path: Path) -> None:
    for name in ("agent/src/oarbank_agent/jobs/run.py", "agent/README.md", "docs/a.md",
                 "examples/modelserver/ui/pages/overview.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "agent/README.md").write_text(
        "`src/oarbank_agent/jobs/run.py`, `jobs/run.py :: go`, `run.py`, `../docs/a.md`,"
        " `ui/pages/overview.json`, `oarbank_agent.jobs.run.go` live; `jobrun.py`,"
        " `jobs/gone.py`, `agent/broker.py`, `oarbank_agent.jobs.gone`, `run.py :: stop`,"
        " `oarbank_agent.jobs.run.stop` are dead\n")
    (tmp_path / "agent/src/oarbank_agent/jobs/run.py").write_text(
        '"""The runner; see ``jobs.py``."""\n\ndef go():\n    """Runs (`docs/a.md`)."""\n')
    tree = Tree(tmp_path, frozenset(
        p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()))
    assert misses(tree) == [
        "agent/README.md: agent/broker.py: no such file",
        "agent/README.md: jobrun.py: no such file",
        "agent/README.md: jobs/gone.py: no such file",
        "agent/README.md: oarbank_agent.jobs.gone: no such module",
        "agent/README.md: oarbank_agent.jobs.run.stop: no stop in it",
        "agent/README.md: run.py: no stop in it",
        "agent/src/oarbank_agent/jobs/run.py: jobs.py: no such file",
    ]
