"""The tree is the architecture: no module over 500 lines, no import circle in the agent, the
SDK, the portal or the harness, and the portal's folders layered.

Every module of ``oarbank_agent``, ``oarbank_sdk`` and ``oarbank_ui`` is read in one sitting
(the lines of its file, 500 at most). The count is a signal, not a goal: a module over it is
split where a concern ends, never trimmed or cut to get under it; one that is a single concern
and stays longer is named in ``LONGER`` with the reason.

Each package's import graph, read with ``ast`` from every ``import`` and ``from ... import`` of
a module (those inside functions and under ``TYPE_CHECKING`` included: an import put off to
break a circle is still one), has no cycle; a failure prints each cycle it found, module by
module. The portal's folders import only the folders below them (``PORTAL_LAYERS``,
ui-pages/README.md's Layout), so no circle can form between them either.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 500
# Modules allowed over MAX_LINES, each with why it is one concern (only modules that are over).
LONGER = {
    "oarbank_agent.platform.api": "the platform interface: one small protocol per part a "
    "backend gives, each part's contract in its docstrings; the parts that stand alone are "
    "in keepapi.py and fateapi.py already",
}
PACKAGES = {
    "oarbank_agent": REPO / "agent" / "src" / "oarbank_agent",
    "oarbank_sdk": REPO / "sdk" / "src" / "oarbank_sdk",
    "oarbank_ui": REPO / "ui-pages" / "src" / "oarbank_ui",
}
# Read for import circles only (the harness is not held to the 500 lines).
CYCLE_CHECKED = {**PACKAGES, "harness": REPO / "harness"}
# The portal's folders, top down: each imports only those after it (cli.py sits above all).
# A new folder goes in its place here (and in ui-pages/README.md's Layout).
PORTAL_LAYERS = ("web", "pages", "dispatch", "store", "ingest", "queries")


def modules(package: str) -> dict[str, Path]:
    """Dotted module name -> its file, for every ``.py`` of ``package``."""
    root = CYCLE_CHECKED[package]
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` (at ``path``) imports, anywhere in it."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package
                pkg = name.split(".") if is_package else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            # `from pkg import mod` names the module; `from mod import thing` the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]
        for t in targets:
            while t and t not in known:  # `import a.b.c` of a name inside a module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], set[str]]]:
    """The strongly connected components with more than one module (Tarjan): each as one
    cycle through it spelled out, and all its modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[tuple[list[str], set[str]]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append((_one_cycle(graph, set(comp)), set(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _one_cycle(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest cycle inside ``comp`` through its first module (breadth first)."""
    start = min(comp)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & comp):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    raise AssertionError("a strongly connected component without a cycle")


def test_no_module_over_500_lines() -> None:
    long, stale = [], set(LONGER)
    for package in PACKAGES:
        for name, path in modules(package).items():
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > MAX_LINES and name not in LONGER:
                long.append(f"{name} ({path.relative_to(REPO)}): {n} lines")
            if n > MAX_LINES:
                stale.discard(name)
    assert not long, (f"modules over {MAX_LINES} lines (split them where a concern ends, or "
                      "name one that is a single concern in LONGER with why):\n  "
                      + "\n  ".join(long))
    assert not stale, f"named in LONGER but not over {MAX_LINES} lines: {sorted(stale)}"


@pytest.mark.parametrize("package", sorted(CYCLE_CHECKED))
def test_no_import_cycle(package: str) -> None:
    known = modules(package)
    graph = {name: imports(name, path, known) for name, path in known.items()}
    found = cycles(graph)
    assert not found, f"import cycles in {package} (one cycle each, then every module of " \
        "its circle):\n  " + "\n  ".join(" -> ".join(c) + f"  [{', '.join(sorted(rest))}]"
                                         for c, rest in found)


def assembled(known: dict[str, Path]) -> list[str]:
    """Classes with two or more bases defined in other modules of ``known``'s package: one class
    assembled from mixins across files (compose parts instead), as "module.Class: base
    (its module), ...". A base is matched by its last name."""
    trees = {n: ast.parse(p.read_text(encoding="utf-8"), str(p)) for n, p in known.items()}
    homes: dict[str, set[str]] = {}
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                homes.setdefault(node.name, set()).add(name)
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            parts = []
            for base in node.bases:
                base_name = ast.unparse(base).rpartition(".")[2]
                there = homes.get(base_name, set())
                if there and name not in there:
                    parts.append(f"{base_name} ({', '.join(sorted(there))})")
            if len(parts) >= 2:
                found.append(f"{name}.{node.name}: {', '.join(parts)}")
    return sorted(found)


@pytest.mark.parametrize("package", sorted(CYCLE_CHECKED))
def test_no_class_assembled_from_mixins_across_files(package: str) -> None:
    found = assembled(modules(package))
    assert not found, f"classes assembled from bases in other modules of {package} " \
        "(give the parts to each other instead):\n  " + "\n  ".join(found)


def upward_imports(graph: dict[str, set[str]], package: str,
                   layers: tuple[str, ...]) -> list[str]:
    """Imports from a folder of ``package`` to one listed before it in ``layers`` (or to the
    package's top-level modules), as "module -> module"."""
    def layer(name: str) -> int | None:
        parts = name.split(".")
        if len(parts) < 3:  # the package or a top-level module (cli): above every folder
            return -1
        return layers.index(parts[1]) if parts[1] in layers else None

    found = []
    for name, deps in sorted(graph.items()):
        here = layer(name)
        if here is None or here < 0:
            continue
        for dep in sorted(deps):
            there = layer(dep)
            if there is not None and there < here:
                found.append(f"{name} -> {dep}")
    return found


def test_the_portals_folders_are_layered() -> None:
    known = modules("oarbank_ui")
    folders = {n.split(".")[1] for n, p in known.items() if p.parent != PACKAGES["oarbank_ui"]}
    unplaced = folders - set(PORTAL_LAYERS)
    assert not unplaced, f"oarbank_ui folders not placed in PORTAL_LAYERS: {sorted(unplaced)}"
    graph = {name: imports(name, path, known) for name, path in known.items()}
    up = upward_imports(graph, "oarbank_ui", PORTAL_LAYERS)
    assert not up, ("imports against the portal's layers (" + " > ".join(PORTAL_LAYERS)
                    + "):\n  " + "\n  ".join(up))


def test_the_layer_check_finds_an_upward_import() -> None:
    graph = {"p.cli": {"p.web.app"}, "p.web.app": {"p.store.s"}, "p.store.s": {"p.web.app"},
             "p.store.t": {"p.cli"}}
    assert upward_imports(graph, "p", ("web", "store")) == ["p.store.s -> p.web.app",
                                                            "p.store.t -> p.cli"]


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [(["a", "b", "c", "a"], {"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_are_read_everywhere_in_a_module(tmp_path: Path) -> None:
    """Function-level, ``TYPE_CHECKING`` and relative imports all count."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from .c import thing\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    known = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py",
             "pkg.c": pkg / "c.py"}
    graph = {n: imports(n, p, known) for n, p in known.items()}
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert cycles(graph)[0][0] == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]


def test_the_mixin_check_finds_a_class_assembled_across_files(tmp_path: Path) -> None:
    """The shape the supervisor had: ``Supervisor(Starting, Stopping)``, each on one base."""
    files = {"base": "class Base:\n    pass\n",
             "starting": "from pkg.base import Base\nclass Starting(Base):\n    pass\n",
             "stopping": "from pkg import base\nclass Stopping(base.Base):\n    pass\n",
             "sup": "from pkg.starting import Starting\nfrom pkg.stopping import Stopping\n"
                    "class Supervisor(Starting, Stopping):\n    pass\n"
                    "class Local(Starting):\n    pass\n"
                    "class Both(Local, Stopping):\n    pass\n"}
    known = {}
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
        known[f"pkg.{name}"] = tmp_path / f"{name}.py"
    assert assembled(known) == ["pkg.sup.Supervisor: Starting (pkg.starting), "
                                "Stopping (pkg.stopping)"]
