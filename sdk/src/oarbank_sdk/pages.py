"""Check module pages and node panels against UI contract 1.2 (contract section 7).

``check_page(path)`` checks one JSON file; ``check_module_pages(manifest)`` checks every file a
manifest lists under ``[ui]``. Problems carry keys like ``ui/pages/overview.json: body[0].source``
so that ``<key>: <message>`` reads as one line a person can act on.

What is checked, and what is left to renderers: the UI contract says a renderer never breaks on
what it does not know, so unknown component types and unknown props are accepted (a console shows
a placeholder); what a known component needs, the common props, sources, columns, tones, the
40-per-container cap and id uniqueness are checked. A component using a 1.2 feature (the
``services`` host query) must say so with ``requires`` >= "1.2", so older consoles show a
placeholder instead of a broken table. Link targets and kv items are read in this project's
and upstream's forms (``page_forms``: the renderer reads them with the same code).

Upstream's pages are checked by upstream's rules where this project does not act on them: a
source is a host query (``query``) or a module view (``view``), never both; ``limit`` is at most
200; the media components (``media``, ``gallery``, ``compare``) carry ``requires`` >= "1.1" and
a ``fallback``. ``module_notes(manifest)`` lists, once each, what a module uses that this
project accepts without acting on it (the manifest's notes, then its pages').
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ._page_refs import reference_notes, reference_problems
from .manifest.model import Manifest, Note, Problem
from .manifest.reader import MISSING, Reader, join
from .page_forms import kv_item, link_target
from .valuekind import describe

__all__ = [
    "COLUMN_TYPES",
    "MAX_PER_CONTAINER",
    "TONES",
    "check_module_pages",
    "check_page",
    "check_page_data",
    "module_notes",
]

MAX_PER_CONTAINER = 40
TONES = ("ok", "warn", "error", "info", "neutral", "running")
FALLBACKS = ("placeholder", "drop")
# Known column types; others are allowed ("and more"): a renderer shows them as text.
COLUMN_TYPES = ("text", "integer", "number", "status", "code", "relative_time", "timestamp",
                "bool")
# Host queries that appeared in a later minor of the contract: query -> minor needed.
QUERY_MINOR = {"services": 2}
# Upstream's media components: each needs "requires" >= 1.<minor> and a fallback (its rule).
MEDIA_MINOR = {"media": 1, "gallery": 1, "compare": 1}
MAX_LIMIT = 200  # upstream's most rows a source asks for
_CONTRACT = re.compile(r"^1\.(\d+)$")

# Known components: prop -> (kind, required). Props not listed are accepted unread.
_COMPONENTS: dict[str, dict[str, tuple[str, bool]]] = {
    "section": {"title": ("string", False), "children": ("components", True)},
    "text": {"text": ("string", True)},
    "table": {"source": ("source", True), "columns": ("columns", True)},
    "status": {"label": ("string", False), "source": ("source", True),
               "field": ("string", True), "tones": ("tones", False)},
    "kv": {"source": ("source", True), "items": ("items", True)},
    "link": {"text": ("string", True), "to": ("target", True)},
}


class _PageReader(Reader):
    """A Reader whose keys are prefixed with the file name: ``<file>: <json path>``."""

    def __init__(self, name: str) -> None:
        super().__init__(table_word="an object")
        self.name = name

    def add(self, key: str, message: str) -> None:
        super().add(f"{self.name}: {key}" if key else self.name, message)


def check_page(path: str | Path, kind: str = "page", name: str | None = None) -> list[Problem]:
    """Problems in one page (``kind="page"``) or node panel (``kind="panel"``) file.

    ``name`` is how the file is shown in problem keys (default: ``path`` as given).
    """
    path = Path(path)
    shown = name if name is not None else str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return [Problem(shown, f"{kind} file does not exist")]
    except UnicodeDecodeError as e:
        return [Problem(shown, f"not UTF-8 text (byte {e.start})")]
    except OSError as e:
        return [Problem(shown, f"cannot read the {kind} file: {e.strerror or e}")]
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return [Problem(shown, f"not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}")]
    return check_page_data(doc, kind, shown)


def check_page_data(doc: Any, kind: str = "page", name: str = "<page>") -> list[Problem]:
    """Like ``check_page`` on an already parsed document."""
    r = _PageReader(name)
    if not isinstance(doc, dict):
        r.add("", f"a {kind} must be a JSON object with ui_contract and body, got {describe(doc)}")
        return r.problems
    contract = doc.get("ui_contract", MISSING)
    if contract is MISSING:
        r.add("ui_contract", 'required key is missing (write "ui_contract": "1.2")')
    elif not isinstance(contract, str) or not _CONTRACT.match(contract):
        r.add("ui_contract", f'expected a UI contract version like "1.2", got {describe(contract)}')
    r.string(doc.get("title", MISSING), "title")
    body = r.get(doc, "body", "", required=True)
    ids: dict[str, str] = {}
    _components(r, body, "body", ids)
    return r.problems


def check_module_pages(manifest: Manifest) -> list[Problem]:
    """Every file under the manifest's ``[ui]``: it exists in the bundle, is a valid page, and
    names only queries a portal answers and services the module has (``_page_refs``)."""
    problems: list[Problem] = []
    for kind, entries in (("page", manifest.pages), ("panel", manifest.panels)):
        for i, entry in enumerate(entries):
            file = manifest.bundle / entry.file
            if not file.is_file():
                problems.append(Problem(f"ui.{kind}s[{i}].file",
                                        f"{entry.file} does not exist in the bundle"))
                continue
            problems.extend(check_page(file, kind, name=entry.file))
            problems.extend(reference_problems(manifest, file, entry.file))
    return problems


def module_notes(manifest: Manifest) -> list[Note]:
    """What the module uses that this project accepts without acting on: one note each, the
    manifest's first, then its pages' and panels' (``_page_refs.reference_notes``)."""
    files = [(manifest.bundle / e.file, e.file) for e in (*manifest.pages, *manifest.panels)
             if (manifest.bundle / e.file).is_file()]
    return [*manifest.notes, *reference_notes(manifest, files)]


# -- components -----------------------------------------------------------------------------


def _components(r: Reader, value: Any, path: str, ids: dict[str, str]) -> None:
    if value is MISSING:
        return
    if not isinstance(value, list):
        r.add(path, f"expected a list of components, got {describe(value)}")
        return
    if len(value) > MAX_PER_CONTAINER:
        r.add(path, f"{len(value)} components; a container holds at most {MAX_PER_CONTAINER} "
              "(group them into sections)")
    for i, comp in enumerate(value):
        _component(r, comp, join(path, i), ids)


def _component(r: Reader, comp: Any, path: str, ids: dict[str, str]) -> None:
    if not isinstance(comp, dict):
        r.add(path, f"expected a component object with a type, got {describe(comp)}")
        return
    ctype = comp.get("type", MISSING)
    if ctype is MISSING:
        r.add(join(path, "type"), "required key is missing: every component has a type")
    elif not isinstance(ctype, str) or not ctype:
        r.add(join(path, "type"), f"expected a non-empty string, got {describe(ctype)}")
        ctype = MISSING

    cid = r.string(comp.get("id", MISSING), join(path, "id"), nonempty=True)
    if cid is not None:
        if cid in ids:
            r.add(join(path, "id"), f'duplicate id "{cid}" (also {ids[cid]}); ids are unique '
                  "within a page")
        ids.setdefault(cid, join(path, "id"))
    minor = _requires(r, comp.get("requires", MISSING), join(path, "requires"))
    r.one_of(comp.get("fallback", MISSING), join(path, "fallback"), FALLBACKS)

    needs = MEDIA_MINOR.get(ctype) if isinstance(ctype, str) else None
    if needs is not None and (minor is None or minor < needs or "fallback" not in comp):
        r.add(path, f'a "{ctype}" component needs "requires": "1.{needs}" (or later) and a '
              '"fallback" ("placeholder" or "drop"), so older consoles draw the fallback')
    if isinstance(comp.get("source"), dict) and ctype not in _COMPONENTS:
        _source(r, comp["source"], join(path, "source"), minor, path)
    props = _COMPONENTS.get(ctype) if isinstance(ctype, str) else None
    if props is None:
        # Unknown type: consoles show a placeholder. Upstream's layouts (columns, tabs) hold
        # components too, and those are checked as everywhere else.
        if isinstance(comp.get("children"), list):
            _components(r, comp["children"], join(path, "children"), ids)
        return
    if ctype == "kv" and _all_literal(comp.get("items")):
        # Upstream's literal-only kv reads no data: a source would be unused.
        props = props | {"source": ("source", False)}
    for prop, (kind, required) in props.items():
        value = r.get(comp, prop, path, required=required)
        p = join(path, prop)
        if kind == "string":
            r.string(value, p)
        elif kind == "components":
            _components(r, value, p, ids)
        elif kind == "source":
            _source(r, value, p, minor, path)
        elif kind == "columns":
            _columns(r, value, p)
        elif kind == "tones":
            _tones(r, value, p)
        elif kind == "items":
            _items(r, value, p)
        elif kind == "target":
            _target(r, value, p)


def _requires(r: Reader, value: Any, path: str) -> int | None:
    """The minor version a component requires, or None."""
    if value is MISSING:
        return None
    m = _CONTRACT.match(value) if isinstance(value, str) else None
    if not m:
        r.add(path, f'expected "1.<minor>" such as "1.2", got {describe(value)}')
        return None
    return int(m.group(1))


def _source(r: Reader, value: Any, path: str, minor: int | None, comp_path: str) -> None:
    src = r.table(value, path)
    if src is None:
        return
    if "view" in src and "query" in src:
        r.add(path, "a source names a host query (query) or a module view (view), not both")
    if "view" in src:  # upstream's module view: [ui.views.<id>] (checked with the manifest)
        r.string(src["view"], join(path, "view"), nonempty=True)
        query = None
    elif "query" not in src:
        r.add(join(path, "query"), "required key is missing: a source names a host query "
              '("query") or a module view ("view")')
        query = None
    else:
        query = r.string(src["query"], join(path, "query"), nonempty=True)
    r.table(src.get("params", MISSING), join(path, "params"))
    r.string_list(src.get("fields", MISSING), join(path, "fields"))
    limit = r.positive_int(src.get("limit", MISSING), join(path, "limit"))
    if limit is not None and limit > MAX_LIMIT:
        r.add(join(path, "limit"), f"at most {MAX_LIMIT} rows, got {limit}")
    needed = QUERY_MINOR.get(query) if query else None
    if needed is not None and (minor is None or minor < needed):
        got = "it has none" if minor is None else f'it has "1.{minor}"'
        r.add(join(path, "query"), f'the "{query}" query is UI contract 1.{needed}: the component '
              f'must carry "requires": "1.{needed}" ({got}) so older consoles show a placeholder')


def _columns(r: Reader, value: Any, path: str) -> None:
    if value is MISSING:
        return
    if not isinstance(value, list):
        r.add(path, f"expected a list of columns, got {describe(value)}")
        return
    if not value:
        r.add(path, "a table needs at least one column")
    for i, col in enumerate(value):
        _keyed_entry(r, col, join(path, i))


def _tones(r: Reader, value: Any, path: str) -> None:
    tones = r.table(value, path)
    for key, tone in (tones or {}).items():
        r.one_of(tone, join(path, key), TONES)


def _items(r: Reader, value: Any, path: str) -> None:
    if value is MISSING:
        return
    if not isinstance(value, list):
        r.add(path, f"expected a list of items, got {describe(value)}")
        return
    for i, item in enumerate(value):
        _item, problems = kv_item(item)
        for key, message in problems:
            r.add(join(join(path, i), key) if key else join(path, i), message)


def _all_literal(items: Any) -> bool:
    if not isinstance(items, list) or not items:
        return False
    return all(isinstance(i, dict) and "value" in i and "field" not in i and "key" not in i
               for i in items)


def _target(r: Reader, value: Any, path: str) -> None:
    if value is MISSING:
        return
    _t, problems = link_target(value)
    for key, message in problems:
        r.add(join(path, key) if key else path, message)


def _keyed_entry(r: Reader, value: Any, path: str) -> None:
    """A column or item table: ``key`` (required), ``label``, ``type``."""
    entry = r.table(value, path)
    if entry is None:
        return
    r.string(r.get(entry, "key", path, required=True), join(path, "key"), nonempty=True)
    r.string(entry.get("label", MISSING), join(path, "label"))
    r.string(entry.get("type", MISSING), join(path, "type"), nonempty=True)
