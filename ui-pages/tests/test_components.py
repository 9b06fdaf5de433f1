"""The UI contract's layout, display and data components, formats, ``when`` and shaping: views
(what to show) and their HTML, with no browser. Charts are parsed as the SVG they are."""

from __future__ import annotations

import html.parser
import xml.etree.ElementTree as ET
from typing import Any

import pytest

from oarbank_sdk.page_forms import Target
from oarbank_ui.pages.components.formats import apply_format, direction_tones
from oarbank_ui.pages.components.when import WhenError, evaluate
from oarbank_ui.pages.html import Templates
from oarbank_ui.pages.render import NOT_SUPPORTED, UNAVAILABLE, WRONG, RenderContext, build_view
from oarbank_ui.queries.shape import ShapeError, read_shaping, shape_rows

NOW = 1_800_000_000.0
SVG = "{http://www.w3.org/2000/svg}"
ROWS = [{"node_id": f"n{i:02d}", "users": i % 4, "latency": 10.0 + i, "state":
         "ready" if i % 3 else "stopped", "t": NOW - 3600 + i * 300} for i in range(12)]


def fetch(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    if query != "services":
        raise LookupError(f"unknown query {query}")
    return [r for r in ROWS if all(r.get(k) == v for k, v in params.items())]


def view(body: list[Any], **ctx: Any) -> list[dict[str, Any]]:
    c = RenderContext(fetch=fetch, now=NOW, **ctx)
    return list(build_view({"ui_contract": "1.2", "body": body}, c)["body"])


def one(comp: dict[str, Any], **ctx: Any) -> dict[str, Any]:
    (v,) = view([comp], **ctx)
    return v


def page_html(body: list[Any], **ctx: Any) -> str:
    v = build_view({"ui_contract": "1.2", "body": body}, RenderContext(fetch=fetch, now=NOW,
                                                                          **ctx))
    return Templates().render("page.html", title="T", subtitle="", view=v, kind="page",
                              problems=[], refresh_url=None, refresh_ms=0, rendered_at="")


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def tags(markup: str) -> list[tuple[str, dict[str, str | None]]]:
    p = _Tags()
    p.feed(markup)
    return p.tags


# -- formats ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "fmt", "text"), [
    (3.14159, ".2f", "3.14"), (0.256, ".1%", "25.6%"), (1234567, ",d", "1,234,567"),
    (12.6, "d", "13"), (3, "+d", "+3"), (-3, "+d", "-3"), (0.05, "+.0%", "+5%"),
    ([3, 8], "d/d", "3/8"), (12345.0, ".2e", "1.23e+04"), ("abc", "s", "abc"),
])
def test_formats(value: Any, fmt: str, text: str) -> None:
    assert apply_format(value, fmt) == text


def test_a_format_that_does_not_fit_the_value_is_a_dash_and_an_unknown_one_is_ignored() -> None:
    v = one({"type": "kv", "items": [{"label": "a", "value": "x", "type": "number",
                                      "format": ".2f"},
                                     {"label": "b", "value": 2.5, "type": "number",
                                      "format": "%Y"},
                                     {"label": "c", "value": [3, "8"], "format": "d/d"}]})
    assert [i["value"]["text"] for i in v["items"]] == [WRONG, "2.5", WRONG]


def test_direction_marks_best_and_worst_and_tone_by_sign() -> None:
    assert direction_tones([3, 1, 2], "max") == [("ok", "best"), ("warn", "worst"), (None, None)]
    assert direction_tones([3, 1, 2], "min") == [("warn", "worst"), ("ok", "best"), (None, None)]
    assert direction_tones([1, 1], "max") == [(None, None), (None, None)]  # nothing to tell
    assert direction_tones([0.5, -0.2, 0], "max", by_sign=True) == [
        ("ok", "better"), ("error", "worse"), (None, None)]
    assert direction_tones(["x", 2], "sideways") == [(None, None), (None, None)]


# -- when -------------------------------------------------------------------------------------


CTX = {"node": {"id": "a", "online": True, "cores": 8}, "user": {"role": "viewer"},
       "job": {}, "row": {}, "setting": {}, "self": "mod.x"}


@pytest.mark.parametrize(("expr", "shown"), [
    ("node.online", True), ("node.online == true", True), ("not node.online", False),
    ("node.cores >= 8 and node.id == 'a'", True), ("node.cores > 8 or user.role == 'viewer'", True),
    ("user.role in ['operator', 'owner']", False), ("job.module == self", False),
    ("node.missing == null", True), ("node.missing > 3", False),
    ("(node.cores < 4 or node.online) and not job.state", True),
])
def test_when(expr: str, shown: bool) -> None:
    assert evaluate(expr, CTX) is shown


@pytest.mark.parametrize(("expr", "why"), [
    ("node.online ==", "ends too early"), ("secret.x", "a path starts with one of"),
    ("node.online = true", "cannot read"), ("node.a == b", "expected a value"),
    ("(node.online", "not closed"), ("node.online node.id", "unexpected"), ("", "non-empty"),
])
def test_a_malformed_when_says_what_is_wrong(expr: str, why: str) -> None:
    with pytest.raises(WhenError, match=why):
        evaluate(expr, CTX)


def test_when_hides_shows_and_a_typo_is_a_placeholder_naming_it() -> None:
    body = [{"type": "text", "text": "online", "when": "node.online"},
            {"type": "text", "text": "offline", "when": "not node.online"},
            {"type": "text", "text": "typo", "when": "node.onlin =="}]
    got = view(body, node="a", subject={"node": {"online": True}})
    assert [(v["kind"], v.get("text")) for v in got] == [("text", "online"),
                                                         ("placeholder", NOT_SUPPORTED)]
    assert "when: the expression ends too early" in got[1]["why"]


# -- shaping ----------------------------------------------------------------------------------


def test_group_by_agg_order_by_limit() -> None:
    s = read_shaping({"group_by": "state", "agg": {"users": "sum", "latency": "max",
                                                   "node_id": "count"}})
    assert shape_rows(ROWS, s) == [
        {"state": "ready", "users": 12, "latency": 21.0, "node_id": 8},
        {"state": "stopped", "users": 6, "latency": 19.0, "node_id": 4}]
    top = shape_rows(ROWS, read_shaping({"order_by": "latency", "limit": 2}))
    assert [r["node_id"] for r in top] == ["n11", "n10"]
    up = shape_rows(ROWS, read_shaping({"order_by": "latency", "descending": False,
                                        "limit": 2, "fields": ["node_id"]}))
    assert up == [{"node_id": "n00"}, {"node_id": "n01"}]
    whole = shape_rows(ROWS, read_shaping({"agg": {"latency": "median", "users": "p95"}}))
    assert whole == [{"latency": 15.5, "users": 3.0}]
    assert shape_rows([], read_shaping({"agg": {"users": "count"}})) == [{"users": 0}]


@pytest.mark.parametrize(("source", "why"), [
    ({"limit": 201}, "limit: expected a whole number from 1 to 200"),
    ({"agg": {"users": "avg"}}, "agg.users: expected one of count"),
    ({"group_by": "state"}, "group_by needs agg"), ({"order_by": "Bad"}, "order_by"),
    ({"fields": "node_id"}, "fields: expected a list"),
])
def test_bad_shaping_is_data_unavailable_naming_the_option(source: dict[str, Any],
                                                           why: str) -> None:
    with pytest.raises(ShapeError, match=why):
        read_shaping(source)
    v = one({"type": "table", "source": {"query": "services", **source}, "columns": ["node_id"]})
    assert v["unavailable"] and why.split(":")[0] in v["reason"]


# -- display ----------------------------------------------------------------------------------


def test_stat_with_format_unit_and_a_sparkline_trend() -> None:
    v = one({"type": "stat", "label": "busy", "field": "users", "format": ",d", "unit": "jobs",
             "source": {"query": "services", "agg": {"users": "sum"}}})
    assert (v["label"], v["value"]["text"]) == ("busy", "18 jobs")
    v = one({"type": "stat", "label": "latency", "field": "latency", "direction": "min",
             "sparkline": "latency", "source": {"query": "services"}})
    assert v["value"]["text"] == "10.0" or v["value"]["text"] == "10"
    assert v["spark"].count(",") == 12 and v["value"]["tone"] == "warn"  # latency rose: worse
    assert one({"type": "stat", "source": {"query": "services"}})["kind"] == "placeholder"
    empty = one({"type": "stat", "field": "x", "source": {"query": "services",
                                                         "params": {"node_id": "zz"}}})
    assert empty["value"]["text"] == WRONG


def test_progress_callout_empty_and_json() -> None:
    p = one({"type": "progress", "label": "done", "value": "users", "total": "latency",
             "source": {"query": "services", "params": {"node_id": "n03"}}})
    assert p["text"] == "3 / 13 (23%)" and p["fraction"] == 23.1
    markup = page_html([{"type": "progress", "label": "done", "value": "users", "total": "latency",
                         "source": {"query": "services", "params": {"node_id": "n03"}}}])
    assert 'aria-valuenow="23.1"' in markup and 'width="23.1"' in markup
    bad = one({"type": "progress", "label": "done", "value": "state", "total": "latency",
               "source": {"query": "services"}})
    assert bad["text"] == WRONG
    assert one({"type": "callout", "text": "careful", "tone": "warn"})["tone"] == "warn"
    assert one({"type": "callout", "text": "fyi", "tone": "purple"})["tone"] == "info"
    e = one({"type": "empty", "text": "no runs yet", "action": {"op": "self.run"}})
    assert e["text"] == "no runs yet" and "coordinator" in e["why"]
    j = one({"type": "json", "source": {"query": "services", "params": {"node_id": "n01"}}})
    assert '"node_id": "n01"' in j["text"] and j["text"].startswith("{")


def test_logs_from_a_source_and_upstreams_stream_is_a_placeholder() -> None:
    lines = one({"type": "logs", "field": "node_id", "time_field": "t",
                 "source": {"query": "services", "limit": 2}})
    assert [line["text"] for line in lines["lines"]] == ["n00", "n01"]
    assert lines["lines"][0]["at"].endswith("UTC")
    stream = one({"type": "logs", "stream": "job"})
    assert stream["kind"] == "placeholder" and "job log stream" in stream["why"]


def test_markdown_subset_typed_links_and_nothing_that_runs() -> None:
    def resolve(t: Target) -> str | None:
        return f"/modules/m/pages/{t.value}" if t.kind == "page" else None

    text = ("Some *emphasis*, `code` and **strong**.\n\n- [overview](page:overview)\n"
            "- [a job](job:12)\n- [out](https://example.org/x)\n"
            "- [bad](javascript:alert(1)) <script>alert(2)</script> <img src=x onerror=alert(3)>\n"
            "\n[data](data:text/html,<script>alert(4)</script>) ![pic](https://x/y.png)\n\n# Big")
    markup = page_html([{"type": "markdown", "text": text}], resolve=resolve)
    body = markup[markup.index('class="component markdown"'):]
    found = tags(body)
    assert not any(t in ("script", "img", "h1", "iframe") for t, _ in found)
    hrefs = [a.get("href") for t, a in found if t == "a"]
    assert hrefs == ["/modules/m/pages/overview", "https://example.org/x", "https://x/y.png"]
    assert not any("on" + "error" in k for _, a in found for k in a)
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in body
    assert ">a job</span>" in body and ">bad</span>" in body
    assert "<em>emphasis</em>" in body and "<code>code</code>" in body and "<li>" in body


def test_tabs_and_columns_lay_out_and_malformed_ones_say_why() -> None:
    t = one({"type": "tabs", "tabs": [{"title": "one", "children": [{"type": "text", "text": "1"}]},
                                      {"title": "two", "children": []}]})
    assert [tab["title"] for tab in t["tabs"]] == ["one", "two"]
    markup = page_html([{"type": "tabs", "tabs": [{"title": "one", "children": []},
                                                  {"title": "two", "children": []}]}])
    assert markup.count("<details class=\"tab\"") == 2 and markup.count(" open>") == 1
    c = one({"type": "columns", "children": [{"type": "text", "text": "a"},
                                             {"type": "text", "text": "b"}]})
    assert c["kind"] == "columns" and len(c["children"]) == 2
    for bad in ({"type": "columns", "children": [{"type": "text", "text": "a"}]},
                {"type": "tabs", "tabs": [{"children": []}]}, {"type": "tabs", "tabs": []}):
        v = one(bad)
        assert v["kind"] == "placeholder" and bad["type"] in v["why"], bad


def test_what_needs_a_coordinator_says_why() -> None:
    body = [{"type": t} for t in ("form", "action", "filter_bar", "media", "gallery", "compare",
                                  "iframe")]
    got = view(body)
    assert [v["kind"] for v in got] == ["placeholder"] * 7
    assert all("coordinator" in v["why"] or "module origin" in v["why"] for v in got)
    assert view([{"type": "form", "fallback": "drop"}]) == []


# -- table ------------------------------------------------------------------------------------


TABLE = {"type": "table", "id": "t", "page_size": 5, "source": {"query": "services"},
         "columns": [{"key": "node_id"}, {"key": "users", "type": "integer", "direction": "max"},
                     {"key": "latency", "type": "number", "format": ".1f", "unit": "ms"},
                     {"key": "state", "sortable": False}]}


def test_table_pages_and_sorts_from_the_request() -> None:
    first = one(TABLE, args={})
    assert [r[0]["text"] for r in first["rows"]] == ["n00", "n01", "n02", "n03", "n04"]
    assert first["pager"]["pages"] == 3 and first["pager"]["prev"] is None
    assert first["pager"]["next"] == "?t.page=2#t-t"
    assert first["rows"][0][2]["text"] == "10.0 ms"
    assert [c["href"] is not None for c in first["columns"]] == [True, True, True, False]
    sorted_desc = one(TABLE, args={"t.sort": "latency", "t.desc": "1", "t.page": "2"})
    assert [r[0]["text"] for r in sorted_desc["rows"]] == ["n06", "n05", "n04", "n03", "n02"]
    assert sorted_desc["columns"][2]["sorted"] == "desc"
    # asking again sorts the other way; paging keeps the sort
    assert sorted_desc["columns"][2]["href"] == "?t.sort=latency#t-t"
    assert sorted_desc["pager"]["prev"] == "?t.desc=1&t.page=1&t.sort=latency#t-t"
    beyond = one(TABLE, args={"t.page": "99", "t.sort": "state"})  # state does not sort
    assert beyond["pager"]["page"] == 3 and [r[0]["text"] for r in beyond["rows"]] == [
        "n10", "n11"]
    # direction: the most users are best, the fewest worst (on every page)
    tones = {r[0]["text"]: r[1]["tone"] for r in first["rows"]}
    assert tones == {"n00": "warn", "n01": None, "n02": None, "n03": "ok", "n04": "warn"}


def test_a_static_preview_shows_the_first_page_and_says_so() -> None:
    v = one(TABLE)  # args None: no server to follow links
    assert v["pager"] == {"page": 1, "pages": 3, "rows": 12, "prev": None, "next": None,
                          "static": True}
    assert all(c["href"] is None for c in v["columns"])
    assert "the live portal pages through them" in page_html([TABLE])
    assert one(TABLE | {"page_size": 2})["kind"] == "placeholder"


# -- chart ------------------------------------------------------------------------------------


def svg_of(markup: str) -> ET.Element:
    start = markup.index("<svg class=\"chart-svg\"")
    return ET.fromstring(markup[start:markup.index("</svg>", start) + 6])


@pytest.mark.parametrize(("kind", "shape"), [("line", "polyline"), ("scatter", "circle"),
                                             ("bar", "rect"), ("histogram", "rect")])
def test_charts_are_svg_drawn_here_with_their_summary(kind: str, shape: str) -> None:
    comp = {"type": "chart", "kind": kind, "source": {"query": "services"}, "x": "t",
            "y": ["latency", "users"], "summary": "Latency & users <rising>", "bins": 4}
    markup = page_html([comp])
    svg = svg_of(markup)
    assert svg.get("role") == "img"
    title, desc = svg.find(f"{SVG}title"), svg.find(f"{SVG}desc")
    assert title is not None and title.text == "Latency & users <rising>"
    assert desc is not None and kind in (desc.text or "")
    assert set((svg.get("aria-labelledby") or "").split()) == {title.get("id"), desc.get("id")}
    marks = [e for e in svg.iter(f"{SVG}{shape}") if "series" in (e.get("class") or "")]
    assert marks, f"no {shape} drawn"
    assert {m.get("class", "").split()[1] for m in marks} == {"s0", "s1"}
    assert '<figcaption class="summary">Latency &amp; users &lt;rising&gt;' in markup
    assert not any(t == "script" for t, _ in tags(markup))
    if kind == "histogram":  # 12 values of each in 4 bins: every value counted once
        heights = [e for e in marks if e.get("class", "").split()[1] == "s0"]
        assert 1 <= len(heights) <= 4


def test_a_line_has_a_gap_where_a_bucket_has_no_value() -> None:
    rows = [{"t": NOW + i * 300, "v": None if i in (3, 4) else float(i)} for i in range(8)]
    ctx = RenderContext(fetch=lambda q, p: rows, now=NOW)
    (v,) = build_view({"body": [{"type": "chart", "kind": "line", "source": {"query": "x"},
                                 "x": "t", "y": ["v"], "summary": "s"}]}, ctx)["body"]
    lines = list(svg_of(str(v["svg"])).iter(f"{SVG}polyline"))
    assert [len((p.get("points") or "").split()) for p in lines] == [3, 3]
    assert v["note"] == ""  # nulls are gaps, not errors


def test_a_chart_without_summary_or_with_bad_props_is_a_placeholder_naming_it() -> None:
    base = {"type": "chart", "kind": "line", "source": {"query": "services"}, "x": "t",
            "y": ["users"], "summary": "s"}
    for change, why in (({"summary": None}, "summary is required"),
                        ({"kind": "pie"}, "kind must be one of"),
                        ({"kind": "parallel_coords"}, "parallel_coords"),
                        ({"y": [f"f{i}" for i in range(7)]}, "y must list 1 to 6"),
                        ({"x": None}, "x must name a field"), ({"bins": 1}, "bins")):
        v = one(base | change)
        assert v["kind"] == "placeholder" and why in v["why"], change
    failing = one(base | {"source": {"query": "nope"}})
    assert failing["unavailable"] and "unknown query nope" in failing["reason"]
    assert UNAVAILABLE in page_html([base | {"source": {"query": "nope"}}])
    odd = one(base | {"y": ["state"]})
    assert odd["note"] == "12 value(s) not numbers, not drawn"


def test_every_view_variant_draws_as_html() -> None:
    """Valid, failing-source and malformed forms of each component all reach the templates
    (which refuse a missing value: StrictUndefined)."""
    bad = {"query": "nope"}
    ok = {"query": "services"}
    body: list[Any] = []
    for src in (ok, bad):
        body += [
            {"type": "stat", "label": "s", "field": "users", "source": src, "sparkline": "users"},
            {"type": "progress", "label": "p", "value": "users", "total": "latency",
             "source": src},
            {"type": "json", "source": src}, {"type": "logs", "field": "node_id", "source": src},
            {"type": "chart", "kind": "histogram", "source": src, "y": ["latency"],
             "summary": "h"},
            {"type": "table", "source": src, "columns": [{"key": "node_id", "type": "node_ref"},
                                                         {"key": "users", "direction": "min"}],
             "row_actions": [{"op": "self.x"}]},
            {"type": "kv", "source": src, "items": [{"label": "u", "field": "users",
                                                     "format": ",d"}]},
            {"type": "status", "label": "st", "field": "state", "source": src}]
    body += [{"type": "text", "text": "t", "tone": "warn"}, {"type": "empty", "text": "e"},
             {"type": "section", "span": 1, "children": [{"type": "callout", "text": "c"}]},
             {"type": "columns", "children": [{"type": "markdown", "text": "m"},
                                              {"type": "tabs", "tabs": [{"title": "x"}]}]},
             {"type": "progress", "label": "p", "value": "state", "total": "users",
              "source": ok}, {"type": "stat", "label": "s"}, {"type": "chart"}]
    markup = page_html(body, args={}, resolve=lambda t: f"/n/{t.value}")
    assert markup.count(UNAVAILABLE) >= 8 and 'href="/n/n00"' in markup
    assert "row actions not shown" in markup
