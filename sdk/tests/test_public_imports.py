"""The agent, the portal, the example and the harness use the SDK through its public names only.

A module or name of ``oarbank_sdk`` starting with ``_`` is the SDK's own business: it may change
with no notice, and a package reaching into it ties two releases together (issue 14). Every
Python file below those folders is parsed (``ast``, nothing is imported) and each of these is a
finding, named by file and line:

- ``import oarbank_sdk._wire``, ``from oarbank_sdk.sandbox._linux import confine``,
  ``from oarbank_sdk.sandbox import _policy``, ``from oarbank_sdk.x import _name``;
- an attribute starting with ``_`` of a name bound to the SDK by an import
  (``launcher._fail``, ``sandbox._BOOT``), also through ``getattr(sandbox, "_BOOT")``;
- a string that is a private module path (``"-m", "oarbank_sdk.sandbox._probe"``).

Dunder names (``__version__``) are public.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("agent", "ui-pages", "examples", "harness")
SKIPPED_DIRS = {"build", "dist", "__pycache__", ".nox", ".venv", "node_modules"}
SDK = "oarbank_sdk"
_MODULE_PATH = re.compile(r"oarbank_sdk(\.[A-Za-z_]\w*)+")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_part(dotted: str) -> str | None:
    return next((p for p in dotted.split(".") if _private(p)), None)


def _chain(node: ast.expr) -> list[str] | None:
    """``a.b.c`` -> ["a", "b", "c"]; None for anything that is not names and attributes."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def private_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each use of a private SDK module or name in ``source``."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    bound: set[str] = set()  # local names that are SDK modules or SDK objects
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == SDK or alias.name.startswith(SDK + "."):
                    if _private_part(alias.name):
                        found.append((node.lineno, f"imports {alias.name}"))
                    bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                node.module == SDK or node.module.startswith(SDK + ".")):
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                if _private_part(dotted):
                    found.append((node.lineno, f"imports {dotted}"))
                bound.add(alias.asname or alias.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            # each private step reports itself: a.b._c.d is found at a.b._c
            if chain and chain[0] in bound and _private(chain[-1]):
                found.append((node.lineno, f"uses {'.'.join(chain)}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            chain = _chain(node.args[0])
            if chain and chain[0] in bound:
                found.append((node.lineno, f"uses {'.'.join(chain)}.{node.args[1].value}"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and _MODULE_PATH.fullmatch(node.value) and _private_part(node.value)):
            found.append((node.lineno, f"names the module {node.value}"))
    return sorted(set(found))


def _python_files() -> list[Path]:
    files = []
    for top in CHECKED:
        for path in (ROOT / top).rglob("*.py"):
            if not SKIPPED_DIRS.intersection(path.relative_to(ROOT).parts):
                files.append(path)
    return sorted(files)


def test_no_package_uses_a_private_sdk_module_or_name() -> None:
    files = _python_files()
    assert len(files) > 100, f"only {len(files)} files found under {CHECKED}: wrong root?"
    problems = [f"{path.relative_to(ROOT)}:{line}: {what}"
                for path in files
                for line, what in private_uses(path.read_text(encoding="utf-8"))]
    assert not problems, ("private SDK names used outside the SDK (give each a public home, "
                          "e.g. oarbank_sdk.protocol or oarbank_sdk.sandbox):\n"
                          + "\n".join(problems))


@pytest.mark.parametrize(("line", "what"), [
    ("import oarbank_sdk._wire", "imports oarbank_sdk._wire"),
    ("import oarbank_sdk.sandbox._linux as lx", "imports oarbank_sdk.sandbox._linux"),
    ("from oarbank_sdk._transport import MAX_HANDLES", "imports oarbank_sdk._transport.MAX_HANDLES"),
    ("from oarbank_sdk.sandbox import wrap, _policy", "imports oarbank_sdk.sandbox._policy"),
    ("from oarbank_sdk.protocol import _helper as helper", "imports oarbank_sdk.protocol._helper"),
    ("import oarbank_sdk.sandbox.launch as launcher\nlauncher._fail(70, 'x')",
     "uses launcher._fail"),
    ("from oarbank_sdk import sandbox\nboot = getattr(sandbox, '_BOOT', '')", "uses sandbox._BOOT"),
    ("import oarbank_sdk\noarbank_sdk.sandbox._policy.FAULT_ENV",
     "uses oarbank_sdk.sandbox._policy"),
    ("argv = ['python', '-m', 'oarbank_sdk.sandbox._probe']",
     "names the module oarbank_sdk.sandbox._probe"),
])
def test_each_form_of_a_private_use_is_found_with_its_line(line: str, what: str) -> None:
    source = "from __future__ import annotations\n\n" + line + "\n"
    got = private_uses(source)
    assert what in [w for _, w in got], got
    assert all(n >= 3 for n, _ in got), got


def test_public_uses_and_private_names_of_ones_own_are_not_findings() -> None:
    source = "\n".join([
        "import oarbank_sdk",
        "from oarbank_sdk import __version__, sandbox",
        "from oarbank_sdk.protocol import current_transport, wire",
        "from oarbank_sdk.valuekind import kind_of as _kind",
        "from . import _local",
        "import os._private_looking_but_not_sdk",
        "_mine = object()",
        "x = _mine._inner, sandbox.wrap(['true']), wire.encode({}), os._exit",
        "doc = 'see oarbank_sdk.sandbox._linux for how'",
        "argv = ['-m', 'oarbank_sdk.sandbox.launch']",
    ])
    assert private_uses(source) == []
