"""The UI contract 1.2 renderer: views (what to show) and their HTML (escaped)."""

from __future__ import annotations

import html.parser
from typing import Any

import pytest

from oarbank_ui.pages.html import Templates
from oarbank_ui.pages.render import (
    NOT_SUPPORTED,
    UNAVAILABLE,
    WRONG,
    RenderContext,
    build_view,
    data_views,
    format_cell,
)

NOW = 1_800_000_000.0
XSS = "<img src=x onerror=alert(1)>"


def fetch_from(rows_by_query: dict[str, list[dict[str, Any]]], calls: list[Any] | None = None):  # type: ignore[no-untyped-def]
    def fetch(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        if calls is not None:
            calls.append((query, params))
        if query not in rows_by_query:
            raise LookupError(f"unknown query {query}")
        return [r for r in rows_by_query[query] if all(r.get(k) == v for k, v in params.items())]

    return fetch


ROWS = [
    {"node_id": "a", "hostname": "h-a", "service": "model", "state": "ready", "users": 3,
     "error": None, "reported_at": NOW - 5, "endpoint": True, "health": "healthy"},
    {"node_id": "b", "hostname": "h-b", "service": "model", "state": "stopped", "users": 0,
     "error": XSS, "reported_at": NOW - 125, "endpoint": False, "health": "unhealthy"},
]


def view_of(body: list[Any], node: str | None = None, calls: list[Any] | None = None,
            rows: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    ctx = RenderContext(fetch=fetch_from({"services": ROWS if rows is None else rows}, calls),
                        node=node, now=NOW)
    return build_view({"ui_contract": "1.2", "title": "T", "body": body}, ctx)


def page_html(view: dict[str, Any]) -> str:
    return Templates().render("page.html", title="T", subtitle="", view=view, kind="page",
                              problems=[], refresh_url="/x?format=json", refresh_ms=1000,
                              rendered_at="00:00:00")


class _Text(html.parser.HTMLParser):
    """Element names and the page's visible text, as a browser's parser sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def parse(markup: str) -> _Text:
    p = _Text()
    p.feed(markup)
    return p


TABLE = {"type": "table", "id": "services", "requires": "1.2",
         "source": {"query": "services"},
         "columns": [{"key": "node_id", "label": "node"}, {"key": "state", "type": "status"},
                     {"key": "users", "type": "integer"}, {"key": "error"},
                     {"key": "reported_at", "type": "relative_time"}]}


def test_table_cells() -> None:
    v = view_of([TABLE])["body"][0]
    assert [c["label"] for c in v["columns"]] == ["node", "state", "users", "error", "reported_at"]
    a, b = ([c["text"] for c in row] for row in v["rows"])
    assert a == ["a", "ready", "3", "", "5 s ago"]
    assert b == ["b", "stopped", "0", XSS, "2 min ago"]
    assert v["rows"][0][1]["tone"] == "ok" and v["rows"][1][1]["tone"] == "neutral"


@pytest.mark.parametrize(
    ("value", "ctype", "text"),
    [
        (3, "integer", "3"), (3.5, "integer", WRONG), ("3", "integer", WRONG),
        (True, "integer", WRONG), (2.5, "number", "2.5"), (7, "number", "7"),
        ("x", "number", WRONG), (True, "bool", "yes"), (False, "bool", "no"), (1, "bool", WRONG),
        ("ready", "status", "ready"), ({"a": 1}, "status", WRONG), ("abc", "code", "abc"),
        ([1], "code", WRONG), (NOW - 7200, "relative_time", "2 h ago"),
        (NOW + 30, "relative_time", "in 30 s"), ("yesterday", "relative_time", WRONG),
        (0, "timestamp", "1970-01-01 00:00:00 UTC"),
        ("2026-01-01T00:00:00Z", "timestamp", "2026-01-01 00:00:00 UTC"),
        ("nope", "timestamp", WRONG), ("x", "text", "x"), (5, "text", "5"),
        ({"a": 1}, "text", WRONG), (None, "integer", ""), ("x", "sparkline", "x"),
        (["cuda", "vulkan"], "text", "cuda, vulkan"), ([1, 2.5, True], "text", "1, 2.5, true"),
        ([], "text", ""), ([["a"]], "text", WRONG), ([{"a": 1}], "text", WRONG),
        (["x"], "sparkline", "x"),
    ],
)
def test_column_types(value: Any, ctype: str, text: str) -> None:
    cell = format_cell(value, ctype, now=NOW)
    assert cell["text"] == text
    assert cell["wrong"] == (text == WRONG)


def test_status_tones_from_the_page_then_defaults() -> None:
    assert format_cell("ready", "status", now=NOW, tones={"ready": "info"})["tone"] == "info"
    assert format_cell("ready", "status", now=NOW, tones={"ready": "purple"})["tone"] == "ok"
    assert format_cell("starting", "status", now=NOW)["tone"] == "running"
    assert format_cell("weird", "status", now=NOW)["tone"] == "neutral"


def test_a_missing_field_is_a_dash() -> None:
    v = view_of([{"type": "table", "source": {"query": "services"},
                  "columns": [{"key": "nonexistent"}]}])["body"][0]
    assert [r[0]["text"] for r in v["rows"]] == [WRONG, WRONG]


def test_unknown_type_and_newer_requires_are_placeholders_rest_renders() -> None:
    body = [
        {"type": "text", "text": "before"},
        {"type": "chart", "source": {"query": "services"}},
        {"type": "table", "requires": "1.7", "source": {"query": "services"},
         "columns": [{"key": "node_id"}]},
        {"type": "table", "requires": "2.0", "source": {"query": "services"},
         "columns": [{"key": "node_id"}]},
        {"type": "chart", "fallback": "drop"},
        {"type": "text", "requires": "1.9", "fallback": "drop", "text": "gone"},
        {"type": "text", "requires": "1.1", "text": "old enough"},
        TABLE,
    ]
    kinds = [(v["kind"], v.get("text")) for v in view_of(body)["body"]]
    assert kinds == [("text", "before"), ("placeholder", NOT_SUPPORTED),
                     ("placeholder", "needs UI contract 1.7"),
                     ("placeholder", "needs UI contract 2.0"), ("text", "old enough"),
                     ("table", None)]


def test_failing_source_is_data_unavailable_and_the_rest_renders() -> None:
    body = [
        {"type": "table", "source": {"query": "nope"}, "columns": [{"key": "x"}]},
        {"type": "kv", "source": {"query": "nope"}, "items": ["x"]},
        {"type": "status", "source": {"query": "nope"}, "field": "x"},
        {"type": "status", "label": "p", "source": {"query": "services"}},  # no field
        TABLE,
    ]
    views = view_of(body)["body"]
    assert [v["unavailable"] for v in views] == [True, True, True, True, False]
    assert "unknown query nope" in views[0]["reason"]
    out = parse(page_html(view_of(body)))
    assert "".join(out.text).count(UNAVAILABLE) == 5  # one per component, hidden on the last


def test_node_in_params() -> None:
    calls: list[Any] = []
    body = [{"type": "status", "label": "model", "requires": "1.2", "field": "state",
             "source": {"query": "services", "params": {"node_id": "$node", "service": "model"}}},
            {"type": "kv", "source": {"query": "services", "params": {"node_id": "$node"}},
             "items": [{"key": "users", "type": "integer"}, {"key": "endpoint", "type": "bool"},
                       "hostname"]}]
    status, kv = view_of(body, node="b", calls=calls)["body"]
    assert calls[0] == ("services", {"node_id": "b", "service": "model"})
    assert status["value"]["text"] == "stopped"
    assert [i["value"]["text"] for i in kv["items"]] == ["0", "no", "h-b"]
    # A page shows no node: "$node" there cannot be answered.
    assert view_of(body)["body"][0]["unavailable"]


def test_a_list_value_renders_as_its_items_in_default_columns_and_kv_items() -> None:
    # Upstream's gpuinfo reports gpu_apis_host as a list: it must read as the list, not "—".
    rows = [{"node_id": "a", "gpu_apis_host": ["cuda", "vulkan"]},
            {"node_id": "b", "gpu_apis_host": []}]
    body = [{"type": "table", "source": {"query": "services"},
             "columns": [{"key": "node_id"}, {"key": "gpu_apis_host"}]},
            {"type": "kv", "source": {"query": "services", "params": {"node_id": "a"}},
             "items": [{"label": "GPU APIs", "field": "gpu_apis_host"}]}]
    table, kv = view_of(body, rows=rows)["body"]
    assert [r[1]["text"] for r in table["rows"]] == ["cuda, vulkan", ""]
    assert not any(r[1]["wrong"] for r in table["rows"])
    assert kv["items"][0]["value"]["text"] == "cuda, vulkan"
    html = page_html(view_of(body, rows=rows))
    assert html.count("cuda, vulkan") == 2 and "not a valid text value" not in html


def test_status_with_no_rows_is_a_dash() -> None:
    body = [{"type": "status", "field": "state",
             "source": {"query": "services", "params": {"node_id": "none"}}}]
    assert view_of(body)["body"][0]["value"]["text"] == WRONG


def test_at_most_40_per_container() -> None:
    texts = [{"type": "text", "text": str(i)} for i in range(45)]
    body = view_of([{"type": "section", "title": "s", "children": texts}])["body"]
    children = body[0]["children"]
    assert [c["text"] for c in children[:40]] == [str(i) for i in range(40)]
    assert children[40]["kind"] == "placeholder"
    assert children[40]["text"] == "5 more components not shown (at most 40 per container)"
    assert len(children) == 41


def test_links() -> None:
    body = [{"type": "link", "text": "panel", "to": "/nodes/$node/x"},
            {"type": "link", "text": "bad", "to": "javascript:alert(1)"},
            {"type": "link", "text": "ext", "to": "https://example.org/a"}]
    a, b, c = view_of(body, node="n 1")["body"]
    assert a["href"] == "/nodes/n%201/x"
    assert b["href"] is None
    assert c["href"] == "https://example.org/a"
    assert "javascript:" not in page_html(view_of(body))


def test_every_string_is_escaped() -> None:
    body = [{"type": "section", "title": XSS, "children": [
        {"type": "text", "text": XSS},
        {"type": "link", "text": XSS, "to": '/x" onclick="alert(1)'},
        {"type": "table", "id": '"><script>alert(1)</script>', "source": {"query": "services"},
         "columns": [{"key": "error", "label": XSS}, {"key": "node_id", "type": XSS}]},
        {"type": XSS},
    ]}]
    markup = page_html(view_of(body))
    out = parse(markup)
    assert "img" not in out.tags and out.tags.count("script") == 1  # only portal.js
    assert 'onclick="alert' not in markup
    visible = "".join(out.text)
    assert visible.count(XSS) >= 4  # section title, text, link text, column label, error cell


def test_page_with_a_newer_major_contract() -> None:
    ctx = RenderContext(fetch=fetch_from({}), now=NOW)
    v = build_view({"ui_contract": "2.0", "body": [{"type": "text", "text": "x"}]}, ctx)
    assert [(c["kind"], c["text"]) for c in v["body"]] == [("placeholder",
                                                            "needs UI contract 2.0")]


@pytest.mark.parametrize("page", [None, [], {"body": "x"}, {"body": [1, "x", None]}])
def test_garbage_pages_render_placeholders(page: Any) -> None:
    v = build_view(page, RenderContext(fetch=fetch_from({}), now=NOW))
    assert all(c["kind"] == "placeholder" for c in v["body"]) and v["body"]
    page_html(v)  # and draws


def test_data_views_are_the_refreshable_parts() -> None:
    v = view_of([{"type": "section", "children": [TABLE, {"type": "text", "text": "x"}]},
                 {"type": "status", "field": "state", "source": {"query": "services"}}])
    dv = data_views(v)
    assert sorted(x["kind"] for x in dv.values()) == ["status", "table"]
    markup = page_html(v)
    for cid in dv:
        assert f'data-cid="{cid}"' in markup
