"""The runner of this module: a job written against the official ``openai`` client, as it
would be against a URL, sending its prompts to the warm `model` service through the agent.

The agent runs (contract section 4):

    python -I model_runner.py run --spec W/spec.json --workdir W --out W/result.json [--events E]
    python -I model_runner.py doctor --json

Payload: ``{"prompts": [str, ...], "api"?: "chat" | "completions", "stream"?: bool,
"max_tokens"?: int}``. Every prompt is one call (``chat.completions.create`` or
``completions.create``; streamed token by token with ``"stream": true``), eight at a time
from threads sharing one client. What differs from a job that reaches the server by URL is
the client's construction (``client()``): ``base_url`` names the service, and
``http_client`` is an ``httpx.Client`` on ``oarbank_sdk.web.HTTPTransport``.

``result.json``: ``{"envelope": 1, "payload": {"texts": [...]}, "provenance":
{"service": [...system_fingerprint...], "first_token_s": [...] (streamed only)}}``.

Exit codes: 0 result written; 2 bad payload (job fault, not retried); 3 no connector; 75 the
service could not be reached (the agent refused, or the connection broke: transient,
retried); 1 the service answered an error. Every non-zero exit writes ``failure.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# A library bundled beside this script wins over the node's (contract section 4).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SERVICE = "model"  # the service (and pool) the stage reserves
MODEL = "stand-in-reverser"
MAX_PARALLEL = 8


class JobFailure(Exception):
    def __init__(self, exit_code: int, reason: str, detail: str, fault: str | None) -> None:
        super().__init__(detail)
        self.exit_code, self.reason, self.detail, self.fault = exit_code, reason, detail, fault


def client():  # -> openai.OpenAI
    """The OpenAI client, as any job builds it; these lines are the change."""
    import httpx
    import openai

    from oarbank_sdk.web import HTTPTransport

    return openai.OpenAI(base_url=f"http://{SERVICE}/v1", api_key="unused",
                         http_client=httpx.Client(transport=HTTPTransport(SERVICE)),
                         timeout=120, max_retries=2)


def write_json_atomically(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_payload(payload: object) -> dict:
    def bad(detail: str) -> JobFailure:
        return JobFailure(2, "bad_payload", detail, "job")

    if not isinstance(payload, dict):
        raise bad("payload must be a JSON object like {\"prompts\": [\"...\"]}")
    unknown = sorted(set(payload) - {"prompts", "api", "stream", "max_tokens"})
    if unknown:
        raise bad(f"unknown payload key(s) {unknown}; expected prompts, api, stream, max_tokens")
    prompts = payload.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise bad("payload.prompts must be a non-empty list of strings")
    api = payload.get("api", "chat")
    if api not in ("chat", "completions"):
        raise bad(f"payload.api must be 'chat' or 'completions', got {api!r}")
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise bad(f"payload.stream must be true or false, got {stream!r}")
    max_tokens = payload.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise bad(f"payload.max_tokens must be a positive integer, got {max_tokens!r}")
    return {"prompts": prompts, "api": api, "stream": stream, "max_tokens": max_tokens}


def one(llm, job: dict, prompt: str) -> dict:
    """One prompt: its text, the service's fingerprint, its first token's delay if streamed."""
    import openai

    extra = {"max_tokens": job["max_tokens"]} if job["max_tokens"] else {}
    t0 = time.monotonic()
    try:
        if job["api"] == "chat":
            messages = [{"role": "user", "content": prompt}]
            if job["stream"]:
                parts, first = [], None
                for chunk in llm.chat.completions.create(model=MODEL, messages=messages,
                                                         stream=True, **extra):
                    delta = chunk.choices[0].delta.content if chunk.choices else None
                    if delta:
                        first = first if first is not None else time.monotonic() - t0
                        parts.append(delta)
                return {"text": "".join(parts), "first_token_s": first}
            out = llm.chat.completions.create(model=MODEL, messages=messages, **extra)
            return {"text": out.choices[0].message.content, "service": out.system_fingerprint}
        if job["stream"]:
            parts, first = [], None
            for chunk in llm.completions.create(model=MODEL, prompt=prompt, stream=True, **extra):
                if chunk.choices and chunk.choices[0].text:
                    first = first if first is not None else time.monotonic() - t0
                    parts.append(chunk.choices[0].text)
            return {"text": "".join(parts), "first_token_s": first}
        out = llm.completions.create(model=MODEL, prompt=prompt, **extra)
        return {"text": out.choices[0].text, "service": out.system_fingerprint}
    except openai.APIConnectionError as exc:  # the agent refused, or the connection broke
        cause = exc.__cause__ or exc.__context__
        raise JobFailure(75, "endpoint_unavailable", f"{exc}: {cause}", "transient") from None
    except openai.APIStatusError as exc:
        raise JobFailure(1, "service_error", f"{exc.status_code}: {exc.message}", None) from None


def run(spec_path: str, workdir: str, out: str, events_path: str | None) -> int:
    try:
        try:
            with open(spec_path, encoding="utf-8") as f:
                spec = json.load(f)
        except (OSError, ValueError) as exc:
            raise JobFailure(2, "bad_spec", f"cannot read {spec_path}: {exc}", "job")
        job = check_payload(spec.get("payload") if isinstance(spec, dict) else None)
        if not os.environ.get(f"OARBANK_SERVICE_{SERVICE.upper()}"):
            raise JobFailure(3, "no_connector", f"OARBANK_SERVICE_{SERVICE.upper()} is not set: "
                             f"the stage must reserve the {SERVICE!r} pool", "host")
        llm = client()
        try:
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(job["prompts"]))) as pool:
                answers = list(pool.map(lambda p: one(llm, job, p), job["prompts"]))
        finally:
            llm.close()
        provenance: dict = {"service": sorted({a["service"] for a in answers if a.get("service")})}
        if job["stream"]:
            provenance["first_token_s"] = [a["first_token_s"] for a in answers]
        write_json_atomically(out, {"envelope": 1,
                                    "payload": {"texts": [a["text"] for a in answers]},
                                    "provenance": provenance})
        return 0
    except JobFailure as exc:
        failure = {"reason": exc.reason, "detail": exc.detail}
        if exc.fault:
            failure["fault"] = exc.fault
        write_json_atomically(os.path.join(workdir, "failure.json"), failure)
        print(f"model_runner: {exc.reason}: {exc.detail}", file=sys.stderr)
        return exc.exit_code


def doctor(as_json: bool) -> int:
    """Health in the contract's form: the client libraries this runner needs import."""
    checks = [{"name": "python", "ok": sys.version_info >= (3, 10),
               "detail": sys.version.split()[0]}]
    for name in ("openai", "httpx", "oarbank_sdk.web.transports"):
        try:
            mod = __import__(name, fromlist=["_"])
            checks.append({"name": name, "ok": True, "detail": getattr(mod, "__version__", "ok")})
        except ImportError as exc:
            checks.append({"name": name, "ok": False,
                           "detail": f"{exc}: pip install 'oarbank-sdk[web]' openai"})
    health = "healthy" if all(c["ok"] for c in checks) else "unhealthy"
    report = {"runner_protocol": {"supported": [1]}, "health": health, "capabilities": [],
              "checks": checks}
    print(json.dumps(report) if as_json else f"{health}: " + ", ".join(
        f"{c['name']} {c['detail']}" for c in checks))
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
