"""One describer for every checker (``oarbank_sdk.valuekind``): the same value is named the same
way in a manifest, a page, a conformance input and a heartbeat, but for the word of a mapping,
which is the format's own (TOML's table, JSON's object). Row by row, then a real TOML manifest
and a real JSON page saying it."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from test_manifest import BASE, edit, problems

from oarbank_sdk import pages
from oarbank_sdk.valuekind import TABLE, describe, kind_of


@pytest.mark.parametrize(("value", "kind", "described"), [
    (None, "null", "null"),
    (True, "a boolean", "a boolean (true)"),
    (False, "a boolean", "a boolean (false)"),
    (3, "an integer", "an integer (3)"),
    (1.5, "a number", "a number (1.5)"),
    ("10m", "a string", 'a string ("10m")'),
    ("x" * 50, "a string", 'a string ("' + "x" * 37 + '...")'),
    ([1], "a list", "a list"),
    ({"a": 1}, "an object", "an object"),
    (datetime.date(2026, 1, 2), "a date/time", "a date/time"),
    (b"raw", "bytes", "bytes"),
])
def test_each_kind_is_named_once(value: Any, kind: str, described: str) -> None:
    assert kind_of(value) == kind
    assert describe(value) == described


def test_a_mapping_is_the_formats_word() -> None:
    assert kind_of({}, mapping=TABLE) == describe({}, mapping=TABLE) == "a table"
    assert kind_of([], mapping=TABLE) == "a list"


def test_a_json_page_says_object_and_a_toml_manifest_says_table(tmp_path: Path) -> None:
    path = tmp_path / "page.json"
    path.write_text(json.dumps({"ui_contract": "1.2", "body": {"type": "text"}}))
    found = {p.key: p.message for p in pages.check_page(path, "page", name="ui/pages/p.json")}
    assert found["ui/pages/p.json: body"] == "expected a list of components, got an object", found
    text = edit('exec = ["python", "-I", "{bundle}/svc.py"]', "exec = { cmd = 1 }", BASE)
    assert problems(tmp_path, text)["services[0].exec"] == (
        "expected a list of strings, got a table")
