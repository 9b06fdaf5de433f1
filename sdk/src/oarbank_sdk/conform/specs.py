"""The conformance kit's service specs (``kit``'s step 6): each ``service_specs`` entry of
``conformance.json``, as HTTP/1.1 with ``Connection: close`` over a connection handed to the
service; the status must match ``expect.status`` (default 200) and the JSON answer contain
``expect.body`` if given.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

from oarbank_sdk import manifest as _manifest
from oarbank_sdk.conform import expect
from oarbank_sdk.conform.goldens import load_json
from oarbank_sdk.conform.report import FAIL, OK, SKIP, Report
from oarbank_sdk.conform.service import SPECS_ATTEMPT, ServiceUnderTest

__all__ = ["run_specs"]

REQUEST_TIMEOUT_S = 30.0


class _HandedHTTP(http.client.HTTPConnection):
    """http.client over a connection the kit handed the service."""

    def __init__(self, service: str, sock: socket.socket) -> None:
        super().__init__(service, timeout=REQUEST_TIMEOUT_S)
        self._handed: socket.socket | None = sock

    def connect(self) -> None:
        assert self._handed is not None
        self._handed.settimeout(REQUEST_TIMEOUT_S)
        self.sock, self._handed = self._handed, None


def _spec_problem(spec: Any) -> str | None:
    if not isinstance(spec, dict):
        return "must be a JSON object"
    unknown = sorted(set(spec) - {"name", "service", "method", "path", "body", "expect"})
    if unknown:
        return f"unknown key(s) {unknown}"
    for key in ("name", "service", "path"):
        if not isinstance(spec.get(key), str) or not spec[key]:
            return f"'{key}' must be a non-empty string"
    if not spec["path"].startswith("/"):
        return "'path' must start with '/'"
    if "method" in spec and not (isinstance(spec["method"], str) and spec["method"].isalpha()):
        return "'method' must be an HTTP method like \"POST\""
    expect = spec.get("expect", {})
    if not isinstance(expect, dict) or set(expect) - {"status", "body"}:
        return "'expect' must be an object with 'status' and/or 'body'"
    status = expect.get("status", 200)
    if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
        return "'expect.status' must be an HTTP status (100-599)"
    return None


def _send_spec(s: ServiceUnderTest, spec: dict) -> tuple[int, bytes]:
    body = spec.get("body")
    headers = {"Connection": "close"}
    data: bytes | None = None
    if isinstance(body, str):
        data = body.encode("utf-8")
    elif body is not None:
        data = json.dumps(body).encode("utf-8")
        headers["Content-Type"] = "application/json"
    method = spec.get("method", "POST").upper()
    if data is None and method in ("POST", "PUT", "PATCH"):
        data = b""  # an explicit Content-Length: 0
    conn = _HandedHTTP(spec["service"], s.hand(SPECS_ATTEMPT))
    try:
        conn.request(method, spec["path"], body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def run_specs(m: _manifest.Manifest, sut: dict[str, ServiceUnderTest], report: Report) -> None:
    path = m.bundle / "conformance.json"
    if not path.exists():
        report.add(SKIP, "service_specs", "no conformance.json")
        return
    doc, err = load_json(path)
    if err is None and not (isinstance(doc, dict)
                            and isinstance(doc.setdefault("service_specs", []), list)):
        # (A file with only `settings` lists no specs: that is a skip, below.)
        err = 'must be {"service_specs": [...], "settings"?: {...}}'
    if err:
        report.add(FAIL, "service_specs", f"conformance.json: {err}")
        return
    if not doc["service_specs"]:
        report.add(SKIP, "service_specs", "conformance.json lists none")
    for i, spec in enumerate(doc["service_specs"]):
        label = spec.get("name") if isinstance(spec, dict) and isinstance(spec.get("name"), str) else f"#{i}"
        name = f"spec {label}"
        problem = _spec_problem(spec)
        if problem:
            report.add(FAIL, name, f"conformance.json service_specs[{i}]: {problem}")
            continue
        s = sut.get(spec["service"])
        if s is None:
            report.add(FAIL, name, f"service {spec['service']!r} is not an endpoint service of "
                       f"the manifest")
            continue
        if not s.ready:
            report.add(SKIP, name, f"service {spec['service']!r} is not ready")
            continue
        want = spec.get("expect", {}).get("status", 200)
        method = spec.get("method", "POST").upper()
        try:
            status, body = _send_spec(s, spec)
        except (OSError, http.client.HTTPException) as exc:
            report.add(FAIL, name, f"{method} {spec['path']}: no answer ({type(exc).__name__}: {exc})")
            continue
        text = body[:200].decode("utf-8", "replace")
        want_body = spec.get("expect", {}).get("body")
        wrong_body = (expect.body_problem(want_body, body)
                      if status == want and "body" in spec.get("expect", {}) else None)
        if wrong_body:
            report.add(FAIL, name, f"{method} {spec['path']} -> {status}, but {wrong_body}")
        elif status == want:
            report.add(OK, name, f"{method} {spec['path']} -> {status}"
                       + (" with the expected body" if want_body is not None else ""))
        else:
            report.add(FAIL, name, f"{method} {spec['path']}: expected status {want}, got "
                       f"{status}: {text}")
