"""The two forms of link targets and kv items a page may use (contract section 7), read once for
the checker (``pages.py``) and the portal's renderer (``oarbank_ui.pages.render``), so the two never
disagree on what a page means.

- ``link.to``: a string path (this project's form), or a typed target object naming exactly one
  of ``job``, ``node``, ``dataset``, ``campaign``, ``page``, ``tab``, ``url`` (upstream's form;
  ``url`` must be https). What the target points at is the portal's business: one it cannot
  resolve is shown as text. ``upload`` (upstream's upload dialog, ``{"upload": {"kind", "then"?}}``)
  is read too: this portal has no uploads, so it is always text (``UPSTREAM_ONLY_TARGETS``).
- ``kv`` items: a field name (string), ``{key, label?, type?}`` (this project's form), or
  ``{label, field?, value?, type?, format?}`` (upstream's: ``field`` reads the source's first
  row, ``value`` is a literal). ``key`` is kept as an alias of ``field``.

What upstream's pages use and this portal does not serve is named here too, for the checker's
notes and the renderer's placeholders alike: ``UPSTREAM_QUERIES`` (upstream's host-query
catalogue), module views (``{"view": <id>}`` sources, computed by upstream's coordinator) and
``UPSTREAM_COMPONENTS`` (component types upstream's console draws, each with why it is not
drawn here); ``not_served(source, host_queries)`` says why a source has no data here.

Each reader returns the normalised value and the problems as ``(sub-key, message)`` pairs, the
sub-key relative to the value read ("" for the value itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .valuekind import kind_of as _kind

__all__ = ["HOST_QUERIES", "NOT_SERVED", "TARGET_KINDS", "UPSTREAM_COMPONENTS", "UPSTREAM_ONLY_TARGETS",
           "UPSTREAM_QUERIES", "KvItem", "Target", "kv_item", "link_target", "not_served"]

TARGET_KINDS = ("job", "node", "dataset", "campaign", "page", "tab", "url")
# Targets only upstream's console opens: read and shown as text, never as a link.
UPSTREAM_ONLY_TARGETS = ("upload",)
Problems = list[tuple[str, str]]

NOT_SERVED = "served by upstream's coordinator, not by this portal"
# every query this project's portal answers (UI contract 1.2; nodes and node_metrics from what
# heartbeats carry, jobs and attempts from its fleet dispatch: contract section 10)
HOST_QUERIES = ("services", "nodes", "node_metrics", "jobs", "attempts")
# Upstream's closed catalogue of host queries (its UI contract 1.0 to 1.2).
UPSTREAM_QUERIES = ("results", "jobs", "attempts", "campaigns", "datasets", "module_settings",
                    "module_events", "nodes", "node_metrics", "store", "services", "secrets",
                    "images", "platforms", "checkpoints")
_OPERATION = "it runs a module operation, which upstream's coordinator runs, not this portal"
_ARTIFACT = "it shows job artifacts, which upstream's coordinator serves, not this portal"
# Component types upstream's console draws and this portal cannot (they need upstream's
# coordinator) -> why. Every other component of UI contract 1 the portal draws itself.
UPSTREAM_COMPONENTS = {
    "form": _OPERATION, "action": _OPERATION,
    "filter_bar": "its values are pushed to upstream's coordinator, which filters the page's "
                  "queries by them; this portal does not",
    "iframe": "frames are served from upstream's module origin, not by this portal",
    "media": _ARTIFACT, "gallery": _ARTIFACT, "compare": _ARTIFACT,
}


def not_served(source: Any, host_queries: tuple[str, ...]) -> str | None:
    """Why ``source`` has no data on this portal although upstream's console serves it (a
    module view, or an upstream host query this portal does not answer), else None."""
    if not isinstance(source, dict):
        return None
    query, view = source.get("query"), source.get("view")
    if query is None and isinstance(view, str):
        return f'module view "{view}" (computed by ui.view.compute)'
    if isinstance(query, str) and query not in host_queries and query in UPSTREAM_QUERIES:
        return f'query "{query}"'
    return None


@dataclass(frozen=True)
class Target:
    """Where a link goes: ``kind`` is ``"path"`` for a plain string, else one of
    ``TARGET_KINDS``; ``value`` the path, id or URL (ids that were integers as text)."""

    kind: str
    value: str


@dataclass(frozen=True)
class KvItem:
    """One kv line: a ``field`` of the source's first row, or a literal ``value``."""

    label: str
    field: str | None
    value: Any
    type: str
    format: str | None
    tones: Any

    @property
    def literal(self) -> bool:
        return self.field is None


def link_target(to: Any) -> tuple[Target | None, Problems]:
    """``link.to`` read in either form."""
    if isinstance(to, str):
        return Target("path", to), []
    if not isinstance(to, dict):
        return None, [("", "expected a string path or a target object with one of "
                           f"{', '.join(TARGET_KINDS)}, got {_kind(to)}")]
    # Other keys are accepted unread, as unknown props are everywhere in a page.
    kinds = [k for k in to if k in TARGET_KINDS or k in UPSTREAM_ONLY_TARGETS]
    problems: Problems = []
    if kinds == ["upload"]:
        return _upload(to["upload"])
    if not kinds:
        return None, [("", f"a target object names exactly one of {', '.join(TARGET_KINDS)}; "
                           f"this one has {', '.join(map(repr, to)) or 'no key'}")]
    if len(kinds) > 1:
        problems.append(("", f"a link target names exactly one of {', '.join(TARGET_KINDS)}, "
                             f"this one names {', '.join(kinds)}"))
        return None, problems
    kind = kinds[0]
    value = to[kind]
    if kind != "url" and isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        value = str(value)  # a numeric id: the same id as its decimal text
    if not isinstance(value, str) or not value:
        problems.append((kind, f"expected a non-empty string, got {_kind(value)}"
                               if not isinstance(value, str) else "expected a non-empty string"))
        return None, problems
    if kind == "url" and not value.lower().startswith("https://"):
        problems.append((kind, f"a url target must be https://, got {value[:80]!r}"))
        return None, problems
    return Target(kind, value), problems


def _upload(value: Any) -> tuple[Target | None, Problems]:
    """``{"upload": {"kind": <dataset kind>, "then"?: <operation>}}``: upstream's upload dialog."""
    if not isinstance(value, dict):
        return None, [("upload", f"expected an object with the dataset kind to upload, got "
                                 f"{_kind(value)}")]
    kind = value.get("kind")
    if not isinstance(kind, str) or not kind:
        return None, [("upload.kind", "required: the dataset kind an upload registers, a "
                                      f"non-empty string (got {_kind(kind)})")]
    then = value.get("then")
    if then is not None and (not isinstance(then, str) or not then):
        return None, [("upload.then", f"expected an operation name, got {_kind(then)}")]
    return Target("upload", kind), []


def kv_item(item: Any) -> tuple[KvItem | None, Problems]:
    """One kv item read in any of its forms."""
    if isinstance(item, str):
        if not item:
            return None, [("", "expected a non-empty field name")]
        return KvItem(item, item, None, "text", None, None), []
    if not isinstance(item, dict):
        return None, [("", f"expected a field name or an item object, got {_kind(item)}")]
    problems: Problems = []  # other keys are accepted unread, as unknown props are
    strings: dict[str, str | None] = {}
    for k in ("label", "field", "key", "type", "format"):
        v = item.get(k)
        if v is not None and (not isinstance(v, str) or not v):
            problems.append((k, f"expected a non-empty string, got {_kind(v)}"
                                if not isinstance(v, str) else "expected a non-empty string"))
            v = None
        strings[k] = v
    field, key = strings["field"], strings["key"]
    if field is not None and key is not None and field != key:
        problems.append(("key", f"`key` is an alias of `field`: give one (field {field!r}, "
                                f"key {key!r})"))
    field = field or key
    has_value = "value" in item
    if field is not None and has_value:
        problems.append(("value", "an item shows a field of the source (`field`/`key`) or a "
                                  "literal `value`, not both"))
    if field is None and not has_value and not any(k in item for k in ("field", "key")):
        problems.append(("field", "required key is missing: an item shows `field` (or its "
                                  "alias `key`) of the source's first row, or a literal `value`"))
    label = strings["label"] or field
    if label is None and has_value:
        problems.append(("label", "required key is missing: an item with a literal value "
                                  "needs a label"))
    if problems:
        return None, problems
    return KvItem(label or "", field, item.get("value") if has_value else None,
                  strings["type"] or "text", strings["format"], item.get("tones")), []
