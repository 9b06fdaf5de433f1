"""Errors that name the fix: the one text of each, shared by ``conform`` and the agent.

A module author meets these first in ``oarbank-sdk conform`` and then on a node; both say the
same words, defined here once. Each function is pure (values in, one line out):

- ``no_hello``: the start window passed and the daemon never said hello;
- ``ready_before_hello``: ``ready`` answered true while no hello had come;
- ``channel_closed``: the service closed its channel (any time; also the agent's log line);
- ``closed_before_hello``: it did so before its hello; whether the daemon is gone and its last
  log line say which fix applies;
- ``fingerprint_problems`` (``protocol_problem``, ``pools_mismatch``): a fingerprint whose
  protocol or pools make every job of the service wait forever;
- ``envelope_problem``: a ``result.json`` that is not ``{"envelope": 1, "payload": {...}}``,
  naming what was found;
- ``starting_wait``: a job waiting on a service that is starting, with the time spent and the
  time allowed;
- ``op_stdout_too_big``, ``result_too_big``: what the agent reads is bounded (an op's stdout
  at ``OP_STDOUT_MAX``, ``result.json`` at ``[results].max_inline_kb``), and more is a failure
  naming the size and the limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

__all__ = [
    "ACCEPTOR_FIX",
    "INHERIT_FIX",
    "CHANNEL_CLOSED",
    "GPU_UNDER_ROOT",
    "SERVICE_PROTOCOL",
    "no_hello",
    "ready_before_hello",
    "channel_closed",
    "closed_before_hello",
    "closed_before_ready",
    "protocol_problem",
    "pools_mismatch",
    "fingerprint_problems",
    "envelope_problem",
    "starting_wait",
    "restart_wait",
    "OP_STDOUT_MAX",
    "RESULT_INLINE_KB",
    "op_stdout_too_big",
    "result_too_big",
]

SERVICE_PROTOCOL = 1  # the only service protocol this SDK and its agent speak

ACCEPTOR_FIX = ("the daemon must create `service_endpoint.Acceptor()` before loading; "
                "it says hello")
INHERIT_FIX = ("`start` must pass the channel on: "
               "`subprocess.Popen(..., **service_endpoint.inherit_channel())`")
CHANNEL_CLOSED = "the service closed its channel"
RESULT_SHAPE = '{"envelope": 1, "payload": {...}}'
OP_STDOUT_MAX = 1 << 20  # bytes of an op's stdout the agent reads (its JSON document)
RESULT_INLINE_KB = 256  # [results].max_inline_kb when the manifest does not say


def no_hello(start_timeout_s: float) -> str:
    return f"no hello within start_timeout_s ({start_timeout_s:g} s): {ACCEPTOR_FIX}"


def ready_before_hello() -> str:
    return (f"`ready` answered true but no hello came: {ACCEPTOR_FIX}, and `ready` may say "
            "true only after it")


def channel_closed(reason: str) -> str:
    """``reason``: how it closed (``end of file``, a read error, a protocol violation)."""
    return f"{CHANNEL_CLOSED} ({reason})"


def closed_before_hello(closed: str, daemon_left: bool, last_log_line: str | None) -> str:
    """The channel closed before any hello. ``closed``: ``channel_closed``'s text;
    ``daemon_left``: a process of the service's start group still ran a moment later;
    ``last_log_line``: the end of the service's log, if any."""
    text = f"{closed} before its hello: "
    if daemon_left:
        text += (f"a process of the service still runs without the channel: {INHERIT_FIX}")
    else:
        text += (f"no process of the service is left: {INHERIT_FIX}, and the daemon must keep "
                 "running (see why it exited)")
    if last_log_line:
        text += f"; the service's last log line: {last_log_line}"
    return text


def closed_before_ready(closed: str, last_log_line: str | None) -> str:
    """The channel closed after the hello, before the service was ready: the daemon exited
    while loading. ``closed``: ``channel_closed``'s text; ``last_log_line``: the end of the
    service's log, if any."""
    text = f"{closed} after its hello, before it was ready: the daemon exited while loading"
    if last_log_line:
        return f"{text}; the service's last log line: {last_log_line}"
    return f"{text} (its log is empty: see why it exited)"


# A module with [sandbox].devices.gpu = "compute" run confined by root: its children may not
# write /proc (sandbox._policy.GPU_PROC_WRITE), which NVIDIA's CUDA driver needs.
GPU_UNDER_ROOT = ('[sandbox].devices.gpu = "compute" confined by root: its children may not '
                  "write /proc (root-owned sysctls and /proc/sysrq-trigger are there), and "
                  "NVIDIA's CUDA driver writes its own /proc/self/task, so cuInit fails inside "
                  "the sandbox (CUDA_ERROR_OPERATING_SYSTEM, 304)")


def protocol_problem(service_protocol: Any) -> str | None:
    """A fingerprint's ``service_protocol`` that does not list 1 (None when it does)."""
    proto = service_protocol
    supported = proto.get("supported") if isinstance(proto, dict) else None
    if isinstance(supported, list) and any(v == SERVICE_PROTOCOL and type(v) is int
                                           for v in supported):
        return None
    return (f"fingerprint service_protocol.supported is {json.dumps(supported)}: it must list "
            f'{SERVICE_PROTOCOL} (answer "service_protocol": {{"supported": [1]}})')


def pools_mismatch(answered: Iterable[str], provides: Iterable[str]) -> str | None:
    """A fingerprint's ``pools`` keys other than the manifest's ``provides.pools`` (a job
    reserving a pool the fingerprint never offers waits forever); None when they agree."""
    got, declared = sorted(set(answered)), sorted(set(provides))
    if got == declared:
        return None
    missing = [p for p in declared if p not in got]
    extra = [p for p in got if p not in declared]
    detail = "; ".join(x for x in (
        f"missing {missing} (jobs reserving them wait forever)" if missing else "",
        f"not in provides.pools: {extra}" if extra else "") if x)
    return (f"fingerprint pools keys {got} differ from the manifest's provides.pools "
            f"{declared}: {detail}; the fingerprint must answer the pools the manifest provides")


def fingerprint_problems(doc: Any, provides: Iterable[str]) -> list[str]:
    """What in a ``fingerprint`` answer keeps every job of the service waiting forever: a
    ``service_protocol.supported`` without 1, ``pools`` keys other than ``provides.pools``,
    a pool count that is not an integer >= 0."""
    if not isinstance(doc, dict):
        return [f"fingerprint answered {_found(doc)}, not a JSON object"]
    problems = [p for p in (protocol_problem(doc.get("service_protocol")),) if p]
    pools = doc.get("pools")
    if not isinstance(pools, dict):
        problems.append(f"fingerprint pools is {_found(pools)}: answer an object with one count "
                        f"per pool of provides.pools {sorted(set(provides))}")
        return problems
    mismatch = pools_mismatch(pools, provides)
    if mismatch:
        problems.append(mismatch)
    for pool in sorted(pools):
        n = pools[pool]
        if not (type(n) is int and n >= 0):
            problems.append(f"fingerprint pools.{pool} is {_found(n)}: a count of jobs, an "
                            "integer >= 0")
    return problems


def envelope_problem(result: Any) -> str | None:
    """What makes ``result`` (result.json, read) not ``{"envelope": 1, "payload": {...}}``,
    naming what was found; None when it is one."""
    if not isinstance(result, dict):
        return f"result.json holds {_found(result)}, not {RESULT_SHAPE}"
    if "envelope" not in result:
        keys = sorted(result)
        return (f"result.json has no 'envelope' (its keys: {keys}): write {RESULT_SHAPE}")
    if result["envelope"] != 1 or type(result["envelope"]) is not int:
        return f"result.json 'envelope' must be 1, got {_found(result['envelope'])}"
    if "payload" not in result:
        return f"result.json has no 'payload' (its keys: {sorted(result)}): write {RESULT_SHAPE}"
    if not isinstance(result["payload"], dict):
        return f"result.json 'payload' must be an object, got {_found(result['payload'])}"
    return None


def starting_wait(service: str, elapsed_s: float, start_timeout_s: float,
                  hello: bool) -> str:
    """A job waiting on ``service`` while it starts."""
    stage = "ready not true yet" if hello else "no hello yet"
    return (f"service {service} is starting: {elapsed_s:.0f} s of its start_timeout_s "
            f"{start_timeout_s:g} s ({stage})")


def restart_wait(service: str, next_in_s: float, failures: int, max_failures: int,
                 error: str | None) -> str:
    """A job waiting on ``service`` while it backs off after a failure."""
    why = f": {error}" if error else ""
    return (f"service {service} failed ({failures} of max_failures {max_failures}){why}; "
            f"next start in {max(0.0, next_in_s):.0f} s")


def _found(value: Any) -> str:
    """A value as a person reads it in a message: its JSON, cut short."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    kind = ("an object" if isinstance(value, dict) else "a list" if isinstance(value, list)
            else "")
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{kind} {text}".strip()


def op_stdout_too_big(op: str, size: int) -> str:
    return (f"{op} printed {size} bytes on stdout, over the limit of {OP_STDOUT_MAX} bytes "
            "(1 MiB): an op prints its one JSON document there; log to stderr")


def result_too_big(size: int, max_inline_kb: float) -> str:
    return (f"result.json is {size} bytes, over [results].max_inline_kb = {max_inline_kb:g} "
            f"({int(max_inline_kb * 1024)} bytes): return less inline, or raise max_inline_kb "
            "in the manifest's [results]")
