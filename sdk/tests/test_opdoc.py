"""Reading an op's stdout: the last line that parses as a JSON object (agent and kit alike)."""

from __future__ import annotations

from oarbank_sdk._opdoc import last_json_object


def test_the_last_object_line_wins_over_logs_and_non_objects() -> None:
    out = 'loading...\n{"ok": false}\n{"ok": true}\n[1, 2]\nnot json\n\n'
    assert last_json_object(out) == {"ok": True}


def test_surrounding_space_is_ignored_and_nothing_usable_is_none() -> None:
    assert last_json_object('  {"running": true}\t\r\n') == {"running": True}
    assert last_json_object("\u00a0{\"ready\": true}") == {"ready": True}
    assert last_json_object("42\n\"text\"\nnull\n") is None
