"""The dispatch bodies (contract section 10) read and checked: pure, no HTTP, no SQL.

Each reader takes the parsed JSON and returns a typed value, or raises ``BadRequest`` naming
the field (its JSON path) and what is wrong with it. A body is checked whole before anything
is stored: a batch with one bad job stores none.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from .catalogue import Catalogue

__all__ = ["MAX_BATCH", "MAX_CLAIM_RESULTS", "MAX_CLAIM_WAIT_S", "MAX_GRANTS", "MAX_PAYLOAD",
           "BadRequest", "Claim",
           "JobSpec", "Release", "Result", "ServiceOffer", "Submission", "attempt_refs",
           "read_claim", "read_release", "read_result", "read_submission"]

MAX_BATCH = 10_000
MAX_PAYLOAD = 64 * 1024  # a job's payload, JSON-encoded
MAX_KEY = 200
MAX_CLAIM_WAIT_S = 30.0
MAX_GRANTS = 1000
MAX_CLAIM_RESULTS = 64  # results a claim may carry (10.4); the body's 1 MiB bounds them too
MAX_RENEW = 10_000
SERVICE_STATES = ("ready", "starting", "stopped")
END_STATES = ("succeeded", "failed")


class BadRequest(ValueError):
    """A body the portal refuses (400), naming the field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(field, f"must be an object, got {_kind(value)}")
    return value


def _text(value: Any, field: str, *, max_len: int = 200) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BadRequest(field, f"must be non-empty text, got {_kind(value)}")
    if len(value) > max_len:
        raise BadRequest(field, f"longer than {max_len} characters")
    return value


def _int(value: Any, field: str, *, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(field, f"must be a whole number, got {_kind(value)}")
    if value < low or (high is not None and value > high):
        raise BadRequest(field, f"must be from {low} to {high}, got {value}" if high is not None
                         else f"must be at least {low}, got {value}")
    return value


def _number(value: Any, field: str, *, low: float = 0.0, high: float | None = None,
            nullable: bool = True) -> float | None:
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(field, f"must be a number{' or null' if nullable else ''}, "
                                f"got {_kind(value)}")
    if value < low or (high is not None and value > high):
        raise BadRequest(field, f"must be from {low:g} to {high:g}, got {value:g}"
                         if high is not None else f"must be at least {low:g}, got {value:g}")
    return float(value)


def _node_id(doc: dict[str, Any]) -> str:
    # compared with the token's node by the caller (403 wrong_node)
    return _text(doc.get("node_id"), "node_id", max_len=4096)


# -- submitting -----------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    module: str  # the module's id (a short name is resolved)
    stage: str
    payload: str  # JSON text, as stored


@dataclass(frozen=True)
class Submission:
    jobs: list[JobSpec]
    idempotency_key: str | None
    digest: str  # of the jobs as submitted: a reused key with other jobs is refused


def _job(value: Any, field: str, catalogue: Catalogue) -> JobSpec:
    doc = _object(value, field)
    for key in doc:
        if key not in ("module", "stage", "payload"):
            raise BadRequest(f"{field}.{key}" if field else key,
                             "unknown key (a job is {module, stage, payload})")
    name = _text(doc.get("module"), f"{field}.module" if field else "module")
    mod = catalogue.resolve(name)
    if mod is None:
        known = ", ".join(catalogue.names()) or "none"
        raise BadRequest(f"{field}.module" if field else "module",
                         f"unknown module {name!r}; the portal dispatches only the modules it "
                         f"serves with --module ({known})")
    stage = _text(doc.get("stage"), f"{field}.stage" if field else "stage")
    if stage not in mod.stages:
        raise BadRequest(f"{field}.stage" if field else "stage",
                         f"module {mod.id} has no stage {stage!r} "
                         f"({', '.join(sorted(mod.stages)) or 'none'})")
    pfield = f"{field}.payload" if field else "payload"
    payload = _object(doc.get("payload"), pfield)
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode()) > MAX_PAYLOAD:
        raise BadRequest(pfield, f"{len(text.encode())} bytes encoded, over the limit of "
                                 f"{MAX_PAYLOAD}")
    return JobSpec(mod.id, stage, text)


def read_submission(doc: Any, catalogue: Catalogue) -> Submission:
    """``POST /v1/jobs``: one job, or ``{"jobs": [...]}``; either with ``idempotency_key``."""
    doc = _object(doc, "")
    key = doc.get("idempotency_key")
    if key is not None:
        key = _text(key, "idempotency_key", max_len=MAX_KEY)
    if "jobs" in doc:
        for k in doc:
            if k not in ("jobs", "idempotency_key"):
                raise BadRequest(k, "unknown key beside jobs (a batch is {jobs, "
                                    "idempotency_key})")
        items = doc["jobs"]
        if not isinstance(items, list):
            raise BadRequest("jobs", f"must be a list, got {_kind(items)}")
        if not 1 <= len(items) <= MAX_BATCH:
            raise BadRequest("jobs", f"must hold 1 to {MAX_BATCH} jobs, got {len(items)}")
        jobs = [_job(j, f"jobs[{i}]", catalogue) for i, j in enumerate(items)]
    else:
        jobs = [_job({k: v for k, v in doc.items() if k != "idempotency_key"}, "", catalogue)]
    h = hashlib.sha256()
    for j in jobs:
        h.update(f"{j.module}\0{j.stage}\0{j.payload}\n".encode())
    return Submission(jobs, key, h.hexdigest())


# -- the agent's side -------------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceOffer:
    module: str
    service: str
    state: str
    pools: dict[str, tuple[int, int]]  # pool -> (free, total)
    load_s: float | None
    job_s: float | None
    mem_gb: float | None


@dataclass(frozen=True)
class Claim:
    node_id: str
    wait_s: float
    max_grants: int
    free_mem_gb: float | None
    evictable_mem_gb: float | None
    stages: dict[str, list[str]]  # module id -> the stages the node offers
    services: list[ServiceOffer]
    # results it carries (10.4), each read on its own: a bad one is refused alone, naming
    # its field, and the claim and the other results go on
    results: tuple[Result | BadRequest, ...] = ()


def read_claim(doc: Any) -> Claim:
    doc = _object(doc, "")
    node = _node_id(doc)
    wait = _number(doc.get("wait_s", 0), "wait_s", high=MAX_CLAIM_WAIT_S, nullable=False)
    max_grants = _int(doc.get("max_grants", MAX_GRANTS), "max_grants", low=1, high=MAX_GRANTS)
    free = _number(doc.get("free_mem_gb"), "free_mem_gb")
    evictable = _number(doc.get("evictable_mem_gb"), "evictable_mem_gb")
    gpus = doc.get("gpus", [])
    if not isinstance(gpus, list):
        raise BadRequest("gpus", f"must be a list, got {_kind(gpus)}")
    mods = doc.get("modules", [])
    if not isinstance(mods, list):
        raise BadRequest("modules", f"must be a list, got {_kind(mods)}")
    stages: dict[str, list[str]] = {}
    services: list[ServiceOffer] = []
    for i, m in enumerate(mods):
        f = f"modules[{i}]"
        m = _object(m, f)
        module = _text(m.get("module"), f"{f}.module")
        st = m.get("stages", [])
        if not isinstance(st, list):
            raise BadRequest(f"{f}.stages", f"must be a list, got {_kind(st)}")
        stages[module] = [_text(s, f"{f}.stages[{j}]") for j, s in enumerate(st)]
        svcs = m.get("services", [])
        if not isinstance(svcs, list):
            raise BadRequest(f"{f}.services", f"must be a list, got {_kind(svcs)}")
        for j, s in enumerate(svcs):
            sf = f"{f}.services[{j}]"
            s = _object(s, sf)
            state = s.get("state")
            if state not in SERVICE_STATES:
                raise BadRequest(f"{sf}.state", f"must be one of {', '.join(SERVICE_STATES)}, "
                                                f"got {state!r}")
            pools_doc = _object(s.get("pools", {}), f"{sf}.pools")
            pools = {}
            for pool, v in pools_doc.items():
                pf = f"{sf}.pools.{pool}"
                v = _object(v, pf)
                total = _int(v.get("total"), f"{pf}.total", low=0)
                free_tokens = _int(v.get("free"), f"{pf}.free", low=0, high=total)
                pools[pool] = (free_tokens, total)
            services.append(ServiceOffer(
                module, _text(s.get("service"), f"{sf}.service"), state, pools,
                _number(s.get("load_s"), f"{sf}.load_s"), _number(s.get("job_s"), f"{sf}.job_s"),
                _number(s.get("mem_gb"), f"{sf}.mem_gb")))
    carried = doc.get("results", [])
    if not isinstance(carried, list):
        raise BadRequest("results", f"must be a list, got {_kind(carried)}")
    if len(carried) > MAX_CLAIM_RESULTS:
        raise BadRequest("results", f"at most {MAX_CLAIM_RESULTS} in one claim, got "
                                    f"{len(carried)}")
    results = tuple(_carried_result(item, f"results[{i}]", node)
                    for i, item in enumerate(carried))
    return Claim(node, float(wait or 0.0), max_grants, free, evictable, stages, services,
                 results)


def _carried_result(item: Any, field: str, node: str) -> Result | BadRequest:
    """One result a claim carries: a result body (10.7) whose ``node_id`` may be left out."""
    if not isinstance(item, dict):
        return BadRequest(field, f"must be an object, got {_kind(item)}")
    if item.get("node_id", node) != node:
        return BadRequest(f"{field}.node_id", "must be the claim's node_id (or left out)")
    try:
        return read_result({**item, "node_id": node})
    except BadRequest as e:
        return BadRequest(f"{field}.{e.field}", e.message)


def attempt_refs(doc: Any) -> tuple[str, list[tuple[int, int]]]:
    """``POST /v1/agent/renew``: the node and its (attempt_id, generation) pairs."""
    doc = _object(doc, "")
    node = _node_id(doc)
    items = doc.get("attempts")
    if not isinstance(items, list):
        raise BadRequest("attempts", f"must be a list, got {_kind(items)}")
    if len(items) > MAX_RENEW:
        raise BadRequest("attempts", f"at most {MAX_RENEW} in one renew, got {len(items)}")
    refs = []
    for i, a in enumerate(items):
        a = _object(a, f"attempts[{i}]")
        refs.append((_int(a.get("attempt_id"), f"attempts[{i}].attempt_id", low=1),
                     _int(a.get("generation"), f"attempts[{i}].generation", low=1)))
    return node, refs


@dataclass(frozen=True)
class Result:
    node_id: str
    attempt_id: int
    generation: int
    state: str
    record: str  # JSON text
    result: str | None


def read_result(doc: Any) -> Result:
    doc = _object(doc, "")
    node = _node_id(doc)
    attempt = _int(doc.get("attempt_id"), "attempt_id", low=1)
    generation = _int(doc.get("generation"), "generation", low=1)
    record = _object(doc.get("record"), "record")
    state = record.get("state")
    if state not in END_STATES:
        raise BadRequest("record.state", f"must be one of {', '.join(END_STATES)}, "
                                          f"got {state!r}")
    result = doc.get("result")
    if result is not None:
        _object(result, "result")
    return Result(node, attempt, generation, str(state),
                  json.dumps(record, separators=(",", ":"), ensure_ascii=False),
                  None if result is None else json.dumps(result, separators=(",", ":"),
                                                         ensure_ascii=False))


@dataclass(frozen=True)
class Release:
    node_id: str
    attempt_id: int
    generation: int
    reason: str


def read_release(doc: Any) -> Release:
    doc = _object(doc, "")
    return Release(_node_id(doc), _int(doc.get("attempt_id"), "attempt_id", low=1),
                   _int(doc.get("generation"), "generation", low=1),
                   _text(doc.get("reason"), "reason"))
