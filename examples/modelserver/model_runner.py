"""The runner of the reference module: one `generate` job sends its prompts to the warm service.

The agent runs (contract section 4):

    python -I model_runner.py run --spec W/spec.json --workdir W --out W/result.json [--events E]
    python -I model_runner.py doctor --json

Payload: ``{"prompts": [str, ...], "hold_s"?: number}``. Every prompt goes to the `model`
service concurrently (``request()`` reuses kept-alive connections through the connector in
OARBANK_SERVICE_MODEL: at most one per thread);
then the runner sleeps ``hold_s`` if given (tests use it to overlap jobs) and writes
``result.json`` atomically:

    {"envelope": 1, "payload": {"texts": [...]},
     "provenance": {"service_pids": [...], "loads": n}}

Exit codes: 0 result written; 2 bad payload (job fault, not retried); 3 no connector (the
node did not give this stage the service); 75 the endpoint refused or closed (transient,
retried); 1 the service answered an error. Every non-zero exit writes ``failure.json``.

Standard library plus ``oarbank_sdk.service_endpoint`` only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# A library bundled beside this script wins over the node's, the SDK included (contract
# section 4): `python -I` leaves the script's own folder off sys.path, so put it first.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from oarbank_sdk import service_endpoint as ep  # noqa: E402

SERVICE = "model"  # the service (and pool) the stage reserves; `oarbank-sdk new` sets it
PATH = "/v1/generate"  # the service's HTTP path
MAX_PARALLEL = 8  # connections in flight per job; the agent allows bursts of 64 connects


class JobFailure(Exception):
    def __init__(self, exit_code: int, reason: str, detail: str, fault: str | None) -> None:
        super().__init__(detail)
        self.exit_code, self.reason, self.detail, self.fault = exit_code, reason, detail, fault


def write_json_atomically(path: str, obj: dict) -> None:
    """Write to a temporary name, then rename: a reader never sees half a file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_payload(payload: object) -> tuple[list[str], float]:
    """(prompts, hold_s) or JobFailure(2): the spec can never succeed."""

    def bad(detail: str) -> JobFailure:
        return JobFailure(2, "bad_payload", detail, "job")

    if not isinstance(payload, dict):
        raise bad("payload must be a JSON object like {\"prompts\": [\"...\"]}")
    unknown = sorted(set(payload) - {"prompts", "hold_s"})
    if unknown:
        raise bad(f"unknown payload key(s) {unknown}; expected 'prompts' and optional 'hold_s'")
    prompts = payload.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise bad("payload.prompts must be a non-empty list of strings")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise bad(f"payload.prompts[{i}] must be a string, got {type(p).__name__}")
    hold_s = payload.get("hold_s", 0)
    if not isinstance(hold_s, (int, float)) or isinstance(hold_s, bool) or hold_s < 0:
        raise bad(f"payload.hold_s must be a non-negative number, got {hold_s!r}")
    return prompts, float(hold_s)


def generate(prompt: str) -> dict:
    """One request to the service. Endpoint refusals are transient; error answers are not."""
    try:
        r = ep.request(SERVICE, "POST", PATH, {"prompt": prompt})
    except ep.EndpointError as exc:  # refused (e.g. service_unavailable) or connector closed
        raise JobFailure(75, "endpoint_unavailable", f"{exc.code}: {exc.detail}", "transient")
    except OSError as exc:  # the service dropped the connection mid-request
        raise JobFailure(75, "connection_lost", f"connection to {SERVICE!r} lost: {exc}",
                         "transient")
    if r.status != 200:
        text = r.body[:500].decode("utf-8", "replace")
        raise JobFailure(1, "service_error", f"POST {PATH} answered {r.status}: {text}",
                         None)
    try:
        answer = r.json()
        if not isinstance(answer.get("text"), str):
            raise ValueError("no string 'text' in the answer")
        return answer
    except (ValueError, AttributeError) as exc:
        raise JobFailure(1, "service_error", f"POST {PATH}: bad answer ({exc})", None)


class Events:
    """Optional progress events, one JSON object per line."""

    def __init__(self, path: str | None) -> None:
        self._f = open(path, "a", encoding="utf-8") if path else None  # noqa: SIM115

    def emit(self, **event: object) -> None:
        if self._f:
            self._f.write(json.dumps({"time": time.time(), **event}) + "\n")
            self._f.flush()


def run(spec_path: str, workdir: str, out: str, events_path: str | None) -> int:
    events = Events(events_path)
    try:
        try:
            with open(spec_path, encoding="utf-8") as f:
                spec = json.load(f)
        except (OSError, ValueError) as exc:
            raise JobFailure(2, "bad_spec", f"cannot read {spec_path}: {exc}", "job")
        payload = spec.get("payload") if isinstance(spec, dict) else None
        prompts, hold_s = check_payload(payload)
        if not os.environ.get(f"OARBANK_SERVICE_{SERVICE.upper()}"):
            raise JobFailure(3, "no_connector",
                             f"OARBANK_SERVICE_{SERVICE.upper()} is not set: the stage must "
                             f"reserve the {SERVICE!r} pool", "host")
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(prompts))) as pool:
            answers = list(pool.map(generate, prompts))
        events.emit(event="generated", prompts=len(prompts))
        if hold_s:
            time.sleep(hold_s)
        write_json_atomically(out, {
            "envelope": 1,
            "payload": {"texts": [a["text"] for a in answers]},
            "provenance": {
                "service_pids": sorted({a.get("pid") for a in answers if isinstance(a.get("pid"), int)}),
                "loads": max((a.get("loads", 0) for a in answers), default=0),
            },
        })
        return 0
    except JobFailure as exc:
        failure = {"reason": exc.reason, "detail": exc.detail}
        if exc.fault:
            failure["fault"] = exc.fault
        write_json_atomically(os.path.join(workdir, "failure.json"), failure)
        print(f"model_runner: {exc.reason}: {exc.detail}", file=sys.stderr)
        return exc.exit_code


def doctor(as_json: bool) -> int:
    """Health in the contract's form (section 4): exit 0 whatever it finds. `unhealthy` when
    this node should run it but something is broken, `undetected` when it cannot run here.
    A real model's runner checks what it needs here (its libraries, a device)."""
    checks = [{"name": "python", "ok": sys.version_info >= (3, 10),
               "detail": sys.version.split()[0]},
              {"name": "service_endpoint", "ok": True, "detail": ep.__name__}]
    health = "healthy" if all(c["ok"] for c in checks) else "unhealthy"
    report = {"runner_protocol": {"supported": [1]}, "health": health, "capabilities": [],
              "checks": checks}
    print(json.dumps(report) if as_json else f"{health}: python {checks[0]['detail']}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="model_runner.py")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--spec", required=True)
    p_run.add_argument("--workdir", required=True)
    p_run.add_argument("--out", required=True)
    p_run.add_argument("--events")
    p_doc = sub.add_parser("doctor")
    p_doc.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.cmd == "doctor":
        return doctor(args.json)
    return run(args.spec, args.workdir, args.out, args.events)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
