"""What the dispatch tests share: credentials issued into a portal's store, and a node played
by the test over HTTP (claims, renews, results as contract section 10 spells them). The agent
side (``oarbank-agent run --claim``) is another piece of work; these tests speak its protocol
by hand, so every request is the one a real agent sends."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from portal_helpers import MODULE_ID, auth

__all__ = ["MODULE_ID", "Answer", "Node", "call", "offer", "submitter_token"]


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    doc: Any

    @property
    def text(self) -> str:
        return json.dumps(self.doc)


def call(url: str, method: str, path: str, doc: Any = None, *, token: str | None = None,
         timeout: float = 10.0, raw: bytes | None = None) -> Answer:
    """One JSON request over loopback TCP (``url``: ``http://host:port``)."""
    host, port = url[len("http://"):].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        body = raw if raw is not None else (b"" if doc is None else json.dumps(doc).encode())
        headers = {"Content-Type": "application/json", **(auth(token) if token else {})}
        conn.request(method, path, body=body if method == "POST" else None, headers=headers)
        r = conn.getresponse()
        data = r.read()
        return Answer(r.status, {k.lower(): v for k, v in r.getheaders()},
                      json.loads(data) if data else None)
    finally:
        conn.close()


def submitter_token(db: Any, name: str) -> str:
    """A submitter token from the real CLI (`oarbank-portal token issue --submitter NAME`)."""
    out = subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "token", "issue",
                          "--submitter", name, "--db", str(db)], capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout.strip()


def offer(state: str = "ready", free: int = 4, total: int = 4, module: str = MODULE_ID,
          **service: Any) -> dict[str, Any]:
    """One module's entry of a claim: the reference module's model service."""
    return {"module": module, "stages": ["generate"],
            "services": [{"service": "model", "state": state,
                          "pools": {"model": {"free": free, "total": total}}, **service}]}


@dataclass
class Node:
    portal: Any  # conftest's PortalProc
    node_id: str
    token: str = ""
    grants: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token:
            self.token = self.portal.token(self.node_id)

    def post(self, path: str, doc: Any, *, portal: Any = None, timeout: float = 10.0) -> Answer:
        return call((portal or self.portal).url, "POST", path, doc, token=self.token,
                    timeout=timeout)

    def claim(self, *modules: dict[str, Any], wait_s: float = 0, portal: Any = None,
              **extra: Any) -> list[dict[str, Any]]:
        r = self.post("/v1/agent/claim", {"node_id": self.node_id, "wait_s": wait_s,
                                          "modules": list(modules) or [offer()], **extra},
                      portal=portal, timeout=wait_s + 10)
        assert r.status == 200, r.text
        got: list[dict[str, Any]] = r.doc["grants"]
        self.grants += got
        return got

    def result_doc(self, grant: dict[str, Any], state: str = "succeeded") -> dict[str, Any]:
        """A result of ``grant`` as the agent reports it (10.7)."""
        return {"node_id": self.node_id, "attempt_id": grant["attempt_id"],
                "generation": grant["generation"],
                "record": {"job_id": f"local-{grant['attempt_id']}", "state": state,
                           "module": grant["module"], "stage": grant["stage"], "attempts": 1},
                "result": {"payload": {"echo": grant["payload"], "by": self.node_id}}}

    def result(self, grant: dict[str, Any], state: str = "succeeded", *,
               portal: Any = None) -> Answer:
        return self.post("/v1/agent/result", self.result_doc(grant, state), portal=portal)

    def renew(self, *grants: dict[str, Any]) -> dict[str, Any]:
        r = self.post("/v1/agent/renew", {"node_id": self.node_id, "attempts": [
            {"attempt_id": g["attempt_id"], "generation": g["generation"]} for g in grants]})
        assert r.status == 200, r.text
        return r.doc  # type: ignore[no-any-return]
