"""Heartbeat validation: what a node may post to ``/v1/heartbeat`` (contract section 6).

Pure: ``parse_heartbeat`` takes the decoded JSON document and returns a ``Heartbeat`` or raises
``HeartbeatError`` whose message names the first offending field (the portal answers 400 with it
and changes nothing). Keys this portal does not know are accepted and kept in ``raw`` (a newer
agent may report more), never acted upon.

Metrics, read when a report carries them (an older agent's report has none, and is stored the
same): ``metrics`` beside ``services`` with the node's ``mem_used_bytes``,
``mem_reserved_bytes`` (what running services reserve), ``mem_total_bytes``,
``gpu_mem_used_bytes`` and ``gpu_mem_total_bytes`` (null where the node cannot tell); on each
service row ``rss_bytes`` (its processes' resident memory) and ``loads`` (how many times the
agent started it). Each is a whole number >= 0 or null.

A short "still alive" (``StillAlive``): ``node_id``, ``hostname``, ``time``, ``heartbeat_s``
and ``alive`` (the digest the portal answered the node's last stored full report with) and no
``services``: the node says nothing changed since that report. A node sends it only to a
portal whose answer carried such a digest (an older portal never offers one, and would refuse
a report without ``services``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from oarbank_sdk.manifest import LIFECYCLES, SERVICE_NAME
from oarbank_sdk.servicerow import BOOL_FIELDS, ServiceRow
from oarbank_sdk.valuekind import kind_of as _kind

__all__ = ["NODE_METRICS", "SERVICE_METRICS", "Heartbeat", "HeartbeatError", "ServiceRow",
           "StillAlive", "parse_heartbeat", "parse_report", "parse_unchanged", "service_metrics"]

NODE_METRICS = ("mem_used_bytes", "mem_reserved_bytes", "mem_total_bytes", "gpu_mem_used_bytes",
                "gpu_mem_total_bytes")
SERVICE_METRICS = ("rss_bytes", "loads")

MAX_SERVICES = 2000  # rows per heartbeat; far above any real node, bounds the work per post
MAX_TEXT = 4096  # characters in any string field (an error message is the longest one)
# A report without heartbeat_s (an older or upstream agent) is judged by the agent's default.
DEFAULT_HEARTBEAT_S = 10.0
MAX_HEARTBEAT_S = 86400.0


class HeartbeatError(ValueError):
    """A malformed heartbeat; ``str()`` is the reason sent back with the 400."""


@dataclass(frozen=True)
class Heartbeat:
    node_id: str
    hostname: str
    time: float
    services: tuple[ServiceRow, ...]
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    agent_stopped: bool = False
    metrics: dict[str, int | None] | None = None  # NODE_METRICS, when the report has them


@dataclass(frozen=True)
class StillAlive:
    node_id: str
    hostname: str
    time: float
    digest: str  # the stored report it repeats (``alive``)
    heartbeat_s: float = DEFAULT_HEARTBEAT_S


_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_ROW_KEYS = ("module", "service", "lifecycle", "users", *BOOL_FIELDS)  # required, in this order
_ROW_KEYSET = frozenset(_ROW_KEYS)


def _at(where: str, key: str) -> str:
    """The field an error names (made only for the error: a valid report builds none)."""
    return f"{where}.{key}" if key else where


def _count(value: Any, where: str, key: str = "") -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        at = _at(where, key)
        raise HeartbeatError(f"{at}: must be a whole number >= 0 or null, got {_kind(value)}"
                             if not isinstance(value, int) or isinstance(value, bool)
                             else f"{at}: must be a whole number >= 0 or null, got {value}")
    return value


def service_metrics(row: ServiceRow) -> dict[str, int | None]:
    """A service row's ``rss_bytes`` and ``loads`` (checked by ``parse_heartbeat``)."""
    return {k: row.raw.get(k) for k in SERVICE_METRICS}


def _text(value: Any, where: str, key: str = "", *, nullable: bool = False,
          empty_ok: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        want = "a string or null" if nullable else "a string"
        raise HeartbeatError(f"{_at(where, key)}: must be {want}, got {_kind(value)}")
    if not value and not empty_ok:
        raise HeartbeatError(f"{_at(where, key)}: must not be empty")
    if len(value) > MAX_TEXT:
        raise HeartbeatError(f"{_at(where, key)}: longer than {MAX_TEXT} characters")
    if "\x00" in value:  # PostgreSQL's text holds no NUL: refused here, by name, on every store
        raise HeartbeatError(f"{_at(where, key)}: must not contain NUL characters (\\u0000)")
    return value


def _row(value: Any, where: str) -> ServiceRow:
    if not isinstance(value, dict):
        raise HeartbeatError(f"{where}: must be an object, got {_kind(value)}")
    if not value.keys() >= _ROW_KEYSET:  # one C-level test for the usual, complete row
        for key in _ROW_KEYS:
            if key not in value:
                raise HeartbeatError(f"{where}.{key}: missing")
    module = _text(value["module"], where, "module")
    service = _text(value["service"], where, "service")
    assert module is not None and service is not None
    if not SERVICE_NAME.match(service):
        raise HeartbeatError(f"{where}.service: {service!r} is not a service name "
                             "(^[a-z][a-z0-9_]*$)")
    flags: dict[str, bool] = {}
    for key in BOOL_FIELDS:
        if not isinstance(value[key], bool):
            raise HeartbeatError(f"{where}.{key}: must be true or false, got {_kind(value[key])}")
        flags[key] = value[key]
    lifecycle = value["lifecycle"]
    if lifecycle not in LIFECYCLES:
        raise HeartbeatError(f"{where}.lifecycle: must be one of {', '.join(LIFECYCLES)}, "
                             f"got {lifecycle!r}")
    users = value["users"]
    if isinstance(users, bool) or not isinstance(users, int) or users < 0:
        raise HeartbeatError(f"{where}.users: must be a whole number >= 0, got {users!r}")
    for key in SERVICE_METRICS:
        _count(value.get(key), where, key)
    return ServiceRow(
        module=module,
        service=service,
        health=_text(value.get("health"), where, "health", nullable=True),
        error=_text(value.get("error"), where, "error", nullable=True, empty_ok=True),
        held=_text(value.get("held"), where, "held", nullable=True),
        lifecycle=lifecycle,
        users=users,
        raw=dict(value),
        **flags,
    )


def parse_heartbeat(doc: Any) -> Heartbeat:
    """Validate a decoded heartbeat; raises ``HeartbeatError`` naming what is wrong."""
    if not isinstance(doc, dict):
        raise HeartbeatError(f"the report must be a JSON object, got {_kind(doc)}")
    for key in ("node_id", "hostname", "time", "services"):
        if key not in doc:
            raise HeartbeatError(f"{key}: missing")
    node_id, hostname, t = _identity(doc)
    services = doc["services"]
    if not isinstance(services, list):
        raise HeartbeatError(f"services: must be a list, got {_kind(services)}")
    if len(services) > MAX_SERVICES:
        raise HeartbeatError(f"services: {len(services)} rows, at most {MAX_SERVICES}")
    rows = tuple(_row(v, f"services[{i}]") for i, v in enumerate(services))
    seen: set[tuple[str, str]] = set()
    for i, row in enumerate(rows):
        pair = (row.module, row.service)
        if pair in seen:
            raise HeartbeatError(f"services[{i}]: {row.module}/{row.service} reported twice")
        seen.add(pair)
    period = _period(doc)
    stopped = doc.get("agent_stopped", False)
    if not isinstance(stopped, bool):
        raise HeartbeatError(f"agent_stopped: must be true or false, got {_kind(stopped)}")
    metrics = doc.get("metrics")
    if metrics is not None:
        if not isinstance(metrics, dict):
            raise HeartbeatError(f"metrics: must be an object, got {_kind(metrics)}")
        metrics = {k: _count(metrics.get(k), "metrics", k) for k in NODE_METRICS}
    return Heartbeat(node_id=node_id, hostname=hostname, time=t, services=rows,
                     heartbeat_s=period, agent_stopped=stopped, metrics=metrics)


def _identity(doc: dict[str, Any]) -> tuple[str, str, float]:
    """``node_id``, ``hostname`` and ``time`` of a report (whole or still-alive), checked."""
    node_id = _text(doc["node_id"], "node_id")
    hostname = _text(doc["hostname"], "hostname")
    assert node_id is not None and hostname is not None
    t = doc["time"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise HeartbeatError(f"time: must be unix seconds (a number >= 0), got {t!r}")
    return node_id, hostname, float(t)


def _period(doc: dict[str, Any]) -> float:
    period = doc.get("heartbeat_s", DEFAULT_HEARTBEAT_S)
    if (isinstance(period, bool) or not isinstance(period, (int, float))
            or not math.isfinite(period) or not 0 < period <= MAX_HEARTBEAT_S):
        raise HeartbeatError(f"heartbeat_s: must be seconds in (0, {MAX_HEARTBEAT_S:g}], "
                             f"got {period!r}")
    return float(period)


def _head(doc: dict[str, Any]) -> tuple[str, str, float, float]:
    for key in ("node_id", "hostname", "time"):
        if key not in doc:
            raise HeartbeatError(f"{key}: missing")
    return (*_identity(doc), _period(doc))


def parse_unchanged(doc: dict[str, Any], digest: str) -> StillAlive:
    """A whole report whose digest (``store.write.report_digest``) is that of a report this
    portal validated and stored: the same document but its ``time``, so only its head is
    checked again; it stands for a still-alive naming ``digest``."""
    node_id, hostname, t, period = _head(doc)
    return StillAlive(node_id, hostname, t, digest, period)


def parse_report(doc: Any) -> Heartbeat | StillAlive:
    """A full heartbeat, or a still-alive (``alive`` and no ``services``)."""
    if isinstance(doc, dict) and "alive" in doc and "services" not in doc:
        node_id, hostname, t, period = _head(doc)
        digest = doc["alive"]
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            raise HeartbeatError("alive: must be the digest the portal answered the last "
                                 "report with (64 hex digits)")
        return StillAlive(node_id, hostname, t, digest, period)
    return parse_heartbeat(doc)
