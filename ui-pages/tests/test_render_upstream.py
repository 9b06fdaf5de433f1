"""The renderer reads upstream's page forms (contract section 7): typed link targets (a target
the portal cannot resolve is text, never a broken link) and kv items ``{label, field?, value?,
type?, format?}`` with ``key`` kept as an alias."""

from __future__ import annotations

import html.parser
import json
import shutil
from pathlib import Path
from typing import Any

from oarbank_sdk.manifest import load
from oarbank_sdk.page_forms import Target
from oarbank_ui.pages.html import Templates
from oarbank_ui.pages.links import link_resolver
from oarbank_ui.pages.modules import PortalModule
from oarbank_ui.pages.preview import write_preview
from oarbank_ui.pages.render import NOT_SUPPORTED, WRONG, RenderContext, build_view

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "modelserver"
NOW = 1_800_000_000.0
ROWS = [{"node_id": "a", "hostname": "h-a", "service": "model", "state": "ready", "users": 3,
         "health": "healthy", "reported_at": NOW - 5}]


def fetch_from(rows_by_query: dict[str, list[dict[str, Any]]], calls: list[Any] | None = None):  # type: ignore[no-untyped-def]
    def fetch(query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        if calls is not None:
            calls.append((query, params))
        return [r for r in rows_by_query[query] if all(r.get(k) == v for k, v in params.items())]

    return fetch


def page_html(view: dict[str, Any]) -> str:
    return Templates().render("page.html", title="T", subtitle="", view=view, kind="page",
                              problems=[], refresh_url="/x?format=json", refresh_ms=1000,
                              rendered_at="00:00:00")


class _Tags(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)


def parse(markup: str) -> _Tags:
    p = _Tags()
    p.feed(markup)
    return p


def view_of(body: list[Any], *, node: str | None = None, resolve=None,  # type: ignore[no-untyped-def]
            calls: list[Any] | None = None) -> dict[str, Any]:
    ctx = RenderContext(fetch=fetch_from({"services": ROWS}, calls), node=node, now=NOW,
                        resolve=resolve)
    return build_view({"ui_contract": "1.2", "body": body}, ctx)


def resolve_pages(target: Target) -> str | None:
    return f"/p/{target.value}" if target.kind == "page" and target.value == "health" else None


def test_typed_targets_link_where_the_portal_has_a_page_and_are_text_elsewhere() -> None:
    body = [{"type": "link", "text": "health", "to": {"page": "health"}},
            {"type": "link", "text": "missing page", "to": {"page": "nope"}},
            {"type": "link", "text": "a tab", "to": {"tab": "health"}},
            {"type": "link", "text": "job", "to": {"job": 7}},
            {"type": "link", "text": "runbook", "to": {"url": "https://example.org/rb"}},
            {"type": "link", "text": "plain http", "to": {"url": "http://example.org/rb"}},
            {"type": "link", "text": "two kinds", "to": {"page": "health", "tab": "x"}},
            {"type": "link", "to": {"dataset": "weights-v2"}}]
    views = view_of(body, resolve=resolve_pages)["body"]
    assert [(v["text"], v["href"]) for v in views] == [
        ("health", "/p/health"), ("missing page", None), ("a tab", None), ("job", None),
        ("runbook", "https://example.org/rb"), ("plain http", None), ("two kinds", None),
        ("weights-v2", None)]
    assert views[2]["why"] == "this portal has no page for tab health"
    assert views[3]["why"] == "this portal has no page for job 7"
    assert views[5]["why"] == "the link's target is malformed"
    markup = page_html(view_of(body, resolve=resolve_pages))
    out = parse(markup)
    assert out.tags.count("a") == 2 + 1  # the two links, and the header's home link
    assert 'href="http://example.org' not in markup
    assert "this portal has no page for tab health" in markup  # the span says why


def test_without_a_resolver_only_https_urls_and_plain_paths_link() -> None:
    body = [{"type": "link", "text": "p", "to": {"page": "health"}},
            {"type": "link", "text": "u", "to": {"url": "https://example.org"}},
            {"type": "link", "text": "s", "to": "/somewhere"}]
    assert [v["href"] for v in view_of(body)["body"]] == [None, "https://example.org",
                                                         "/somewhere"]


def test_a_node_target_of_dollar_node_is_the_node_shown() -> None:
    seen: list[Target] = []

    def resolve(t: Target) -> str | None:
        seen.append(t)
        return f"/n/{t.value}"

    [v] = view_of([{"type": "link", "text": "n", "to": {"node": "$node"}}], node="gpu-7",
                  resolve=resolve)["body"]
    assert v["href"] == "/n/gpu-7" and seen == [Target("node", "gpu-7")]


def test_kv_items_in_upstreams_form_next_to_ours() -> None:
    src = {"query": "services", "params": {"node_id": "a"}}
    body = [{"type": "kv", "requires": "1.2", "source": src, "items": [
        {"label": "state", "field": "state", "type": "status"},
        {"label": "jobs", "field": "users", "type": "integer", "format": "compact"},
        {"label": "served by", "value": "oarbank"},
        {"label": "slots", "value": 4, "type": "integer"},
        {"label": "bad literal", "value": "four", "type": "integer"},
        {"key": "health", "label": "health (ours)"},
        {"label": "gone", "field": "no_such_field"},
        "hostname",
    ]}]
    [kv] = view_of(body)["body"]
    got = [(i["label"], i["value"]["text"]) for i in kv["items"]]
    assert got == [("state", "ready"), ("jobs", "3"), ("served by", "oarbank"), ("slots", "4"),
                   ("bad literal", WRONG), ("health (ours)", "healthy"), ("gone", WRONG),
                   ("hostname", "h-a")]
    assert kv["items"][0]["value"]["tone"] == "ok"


def test_a_literal_only_kv_reads_no_data() -> None:
    calls: list[Any] = []
    [kv] = view_of([{"type": "kv", "items": [{"label": "model", "value": "stand-in"}]}],
                   calls=calls)["body"]
    assert kv["unavailable"] is False and calls == []
    assert [(i["label"], i["value"]["text"]) for i in kv["items"]] == [("model", "stand-in")]


def test_malformed_kv_items_are_a_placeholder_not_a_crash() -> None:
    for items in ([{"label": "x", "field": "a", "value": 1}], [{"value": 1}], [{"label": "x"}],
                  [{"field": "a", "key": "b"}]):
        [v] = view_of([{"type": "kv", "source": {"query": "services"}, "items": items}])["body"]
        assert v["kind"] == "placeholder" and v["text"] == NOT_SUPPORTED, items


def test_the_portal_resolves_pages_of_the_module_and_nodes_to_its_panel() -> None:
    mod = PortalModule(load(EXAMPLE))
    resolve = link_resolver(mod)
    assert resolve(Target("page", "overview")) == "/modules/dev.example.modelserver/pages/overview"
    assert resolve(Target("page", "nope")) is None
    assert resolve(Target("node", "gpu 1")) == (
        "/nodes/gpu%201/modules/dev.example.modelserver/panels/node")
    for kind in ("job", "dataset", "campaign", "tab"):
        assert resolve(Target(kind, "x")) is None


def test_the_preview_links_its_own_files_and_shows_other_targets_as_text(tmp_path: Path) -> None:
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    page = mod / "ui" / "pages" / "overview.json"
    doc = json.loads(page.read_text())
    doc["body"] += [{"type": "link", "id": "p", "text": "again", "to": {"page": "overview"}},
                    {"type": "link", "id": "n", "text": "node", "to": {"node": "node-x"}},
                    {"type": "link", "id": "t", "text": "tab", "to": {"tab": "health"}}]
    page.write_text(json.dumps(doc))
    write_preview(mod, tmp_path / "out", node="node-x")
    html = (tmp_path / "out" / "page-overview.html").read_text()
    assert '<a href="page-overview.html">again</a>' in html
    assert '<a href="panel-node.html">node</a>' in html
    assert 'title="this portal has no page for tab health">tab</span>' in html
