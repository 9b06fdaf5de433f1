"""oarbank_sdk.pages: UI contract 1.2 page and panel files, checked from real files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oarbank_sdk import manifest, pages

SEED = Path(__file__).parent / "manifests" / "seed"

SERVICES_TABLE = {
    "type": "table", "id": "svc", "requires": "1.2", "fallback": "placeholder",
    "source": {"query": "services"},
    "columns": [{"key": "hostname", "label": "node"}, {"key": "state", "type": "status"}],
}


def page_problems(tmp_path: Path, doc: Any, kind: str = "page") -> dict[str, str]:
    path = tmp_path / "page.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return {p.key: p.message for p in pages.check_page(path, kind, name="ui/pages/p.json")}


def page(*body: Any) -> dict[str, Any]:
    return {"ui_contract": "1.2", "body": list(body)}


def test_seed_page_and_panel_are_valid() -> None:
    assert pages.check_page(SEED / "ui" / "pages" / "overview.json") == []
    assert pages.check_page(SEED / "ui" / "panels" / "node.json", kind="panel") == []
    assert pages.check_module_pages(manifest.load(SEED)) == []


def test_unknown_component_type_is_accepted(tmp_path: Path) -> None:
    doc = page({"type": "heatmap", "requires": "1.7", "fallback": "drop", "whatever": [1]})
    assert page_problems(tmp_path, doc) == {}


def test_keys_name_the_file_and_json_path(tmp_path: Path) -> None:
    doc = page({"type": "section", "children": [dict(SERVICES_TABLE, source={"params": {}})]})
    found = page_problems(tmp_path, doc)
    assert found == {"ui/pages/p.json: body[0].children[0].source.query":
                     'required key is missing: a source names a host query ("query") or a module '
                     'view ("view")'}


CASES = [
    ("ui-contract-missing", {"body": []}, "ui_contract", "missing"),
    ("ui-contract-bad", {"ui_contract": 1.2, "body": []}, "ui_contract", '"1.2"'),
    ("ui-contract-major-2", {"ui_contract": "2.0", "body": []}, "ui_contract", '"1.2"'),
    ("body-missing", {"ui_contract": "1.2"}, "body", "missing"),
    ("body-not-list", {"ui_contract": "1.2", "body": {}}, "body", "list of components"),
    ("body-over-40", page(*[{"type": "text", "text": "x"}] * 41), "body", "at most 40"),
    ("section-over-40",
     page({"type": "section", "title": "t", "children": [{"type": "text", "text": "x"}] * 41}),
     "body[0].children", "at most 40"),
    ("type-missing", page({"text": "x"}), "body[0].type", "missing"),
    ("type-not-string", page({"type": 3}), "body[0].type", "expected a non-empty string"),
    ("requires-form", page({"type": "text", "text": "x", "requires": "2"}),
     "body[0].requires", '"1.<minor>"'),
    ("requires-number", page({"type": "text", "text": "x", "requires": 1.2}),
     "body[0].requires", "got a number"),
    ("fallback", page({"type": "text", "text": "x", "fallback": "hide"}),
     "body[0].fallback", '"placeholder", "drop"'),
    ("text-missing", page({"type": "text"}), "body[0].text", "missing"),
    ("text-wrong-type", page({"type": "text", "text": ["a"]}), "body[0].text", "got a list"),
    ("section-children-missing", page({"type": "section", "title": "t"}),
     "body[0].children", "missing"),
    ("table-columns-missing", page({"type": "table", "source": {"query": "jobs"}}),
     "body[0].columns", "missing"),
    ("table-columns-empty", page({"type": "table", "source": {"query": "jobs"}, "columns": []}),
     "body[0].columns", "at least one column"),
    ("column-key-missing", page(dict(SERVICES_TABLE, columns=[{"label": "x"}])),
     "body[0].columns[0].key", "missing"),
    ("column-type-wrong", page(dict(SERVICES_TABLE, columns=[{"key": "x", "type": 1}])),
     "body[0].columns[0].type", "expected a string"),
    ("source-not-object", page(dict(SERVICES_TABLE, source="services")),
     "body[0].source", "expected an object"),
    ("source-params", page(dict(SERVICES_TABLE, source={"query": "services", "params": [1]})),
     "body[0].source.params", "expected an object"),
    ("source-fields", page(dict(SERVICES_TABLE, source={"query": "services", "fields": [1]})),
     "body[0].source.fields[0]", "expected a string"),
    ("services-without-requires",
     page({k: v for k, v in SERVICES_TABLE.items() if k != "requires"}),
     "body[0].source.query", '"requires": "1.2" (it has none)'),
    ("services-requires-1.1", page(dict(SERVICES_TABLE, requires="1.1")),
     "body[0].source.query", 'it has "1.1"'),
    ("status-tone", page({"type": "status", "label": "s", "source": {"query": "jobs"},
                          "field": "state", "tones": {"ready": "green"}}),
     "body[0].tones.ready", '"green" is not one of "ok", "warn", "error", "info"'),
    ("status-field-missing", page({"type": "status", "source": {"query": "jobs"}}),
     "body[0].field", "missing"),
    ("kv-items", page({"type": "kv", "source": {"query": "jobs"}, "items": [{"label": "x"}]}),
     "body[0].items[0].field", "missing"),
    ("kv-items-not-list", page({"type": "kv", "source": {"query": "jobs"}, "items": "a"}),
     "body[0].items", "list of items"),
    ("link-to-missing", page({"type": "link", "text": "docs"}), "body[0].to", "missing"),
    ("component-not-object", page("hello"), "body[0]", "component object"),
    ("duplicate-ids",
     page({"type": "text", "id": "a", "text": "x"},
          {"type": "section", "children": [{"type": "text", "id": "a", "text": "y"}]}),
     "body[1].children[0].id", 'duplicate id "a" (also body[0].id)'),
]


@pytest.mark.parametrize(("doc", "key", "fragment"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_each_page_error_names_its_path(tmp_path: Path, doc: Any, key: str, fragment: str) -> None:
    found = page_problems(tmp_path, doc)
    full = f"ui/pages/p.json: {key}"
    assert full in found, f"no problem at {full}; got {found}"
    assert fragment in found[full]


def test_every_page_problem_is_reported(tmp_path: Path) -> None:
    doc = {"ui_contract": "one", "body": [{"type": "text"}, {"type": "link", "text": 1, "to": "/"},
                                         {"type": "table", "source": {"query": "services"},
                                          "columns": [{}]}]}
    found = page_problems(tmp_path, doc)
    assert set(found) == {f"ui/pages/p.json: {k}" for k in (
        "ui_contract", "body[0].text", "body[1].text", "body[2].source.query",
        "body[2].columns[0].key")}


def test_not_json_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{"ui_contract": "1.2",\n "body": [,]}', encoding="utf-8")
    (problem,) = pages.check_page(path)
    assert problem.key == str(path)
    assert "not valid JSON at line 2, column" in problem.message


def test_page_must_be_an_object(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text("[]", encoding="utf-8")
    (problem,) = pages.check_page(path, kind="panel")
    assert "a panel must be a JSON object" in problem.message


def test_missing_file(tmp_path: Path) -> None:
    (problem,) = pages.check_page(tmp_path / "none.json")
    assert "does not exist" in problem.message
