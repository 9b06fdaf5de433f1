"""Node credentials and the checks on every report (contract 6.2), against a real portal
process: tokens issued by the real CLI, reports over real HTTP (and HTTPS), the agent's own
heartbeat sender in the node's place.

The first test is the operator's scenario from issue 17: a forged report for another node
with a far-future time used to be stored and freeze that node's rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from portal_helpers import MODULE_ID, auth, heartbeat, service_row

from testsupport.senders import until_answered

CLI = [sys.executable, "-m", "oarbank_ui.cli"]


def portal_cli(*args: str, db: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args, "--db", str(db)], capture_output=True, text=True,
                          timeout=60)


def refused_counts(p: Any) -> dict[str, float]:
    text = p.get("/metrics").text
    out = {}
    for line in text.splitlines():
        if line.startswith("oarbank_portal_reports_refused_total{"):
            cause = line.split('cause="', 1)[1].split('"', 1)[0]
            out[cause] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_forged_report_is_refused_and_changes_nothing(start_portal, http_request) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    assert p.post_heartbeat(heartbeat("node-a", service_row(users=1))).status == 200
    before = p.services()
    forged = heartbeat("node-a", service_row(error="FORGED: disk on fire"), t=4102444800)
    # no token, a made-up token, node-b's own token: nothing is stored
    r = http_request(p.url, "POST", "/v1/heartbeat", forged)
    assert r.status == 401 and "no node credential" in r.json()["error"]
    assert r.headers["www-authenticate"].startswith("Bearer")
    r = http_request(p.url, "POST", "/v1/heartbeat", forged, headers=auth("oarbank_made_up"))
    assert r.status == 401 and "not one this portal issued" in r.json()["error"]
    r = p.post_heartbeat(forged, token=p.token("node-b"))
    assert r.status == 403
    assert r.json()["error"] == ("heartbeat: the token is node 'node-b''s; this report is for "
                                 "'node-a'")
    assert p.services() == before
    counts = refused_counts(p)
    assert (counts["unauthenticated"], counts["wrong_node"], counts["malformed"]) == (2, 1, 0)
    # The node's own report with a far-future time is stored, and does not freeze the node:
    # reports are ordered by when the portal received them.
    assert p.post_heartbeat(heartbeat("node-a", service_row(users=7), t=4102444800)).json()[
        "applied"]
    r = p.post_heartbeat(heartbeat("node-a", service_row(users=2)))
    assert r.json()["applied"] is True
    assert [x["users"] for x in p.services()] == [2]


def test_only_json_and_only_served_hosts(start_portal, http_request) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    doc = heartbeat("node-a", service_row())
    tok = auth(p.token("node-a"))
    # what any web page can send cross-site without a preflight: text/plain, a form
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = http_request(p.url, "POST", "/v1/heartbeat", raw=json.dumps(doc).encode(),
                         headers=tok | {"Content-Type": ctype})
        assert r.status == 415, ctype
        assert f"Content-Type must be application/json, got {ctype}" in r.json()["error"]
    # DNS rebinding: a name that resolves to the portal's address, but is not one it serves
    r = http_request(p.url, "POST", "/v1/heartbeat", doc, headers=tok | {"Host": "evil.example"})
    assert r.status == 400 and "Host 'evil.example' is not served here" in r.json()["error"]
    assert http_request(p.url, "GET", "/", headers={"Host": "evil.example:80"}).status == 400
    assert p.services() == []
    port = p.url.rsplit(":", 1)[1]
    assert http_request(p.url, "GET", "/", headers={"Host": f"localhost:{port}"}).status == 200
    # application/json with parameters is still JSON
    r = http_request(p.url, "POST", "/v1/heartbeat", raw=json.dumps(doc).encode(),
                     headers=tok | {"Content-Type": "application/json; charset=utf-8"})
    assert r.status == 200
    # --allowed-host: the name a reverse proxy forwards
    q = start_portal(args=("--allowed-host", "portal.example"))
    assert http_request(q.url, "GET", "/", headers={"Host": "portal.example"}).status == 200
    assert http_request(q.url, "GET", "/", headers={"Host": "127.0.0.1"}).status == 400


def test_token_cli_issue_list_revoke(start_portal, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    r = portal_cli("token", "issue", "node-a", db=p.db)
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    assert token.startswith("oarbank_") and len(token) > 40
    assert "shown only now" in r.stderr
    # only the hash is stored: the token appears nowhere in the database files
    for f in Path(p.db).parent.glob("portal.db*"):
        assert token.encode() not in f.read_bytes(), f
    with contextlib.closing(sqlite3.connect(p.db)) as db:  # (sqlite3's own `with` only commits)
        (stored,) = db.execute("SELECT token_hash FROM node_tokens").fetchone()
    assert len(stored) == 64 and stored != token
    listed = portal_cli("token", "list", db=p.db)
    assert listed.stdout.startswith("node-a\tissued 20") and token not in listed.stdout
    doc = heartbeat("node-a", service_row())
    assert p.post_heartbeat(doc, token=token).status == 200
    again = portal_cli("token", "issue", "node-a", db=p.db)  # rotation: the old one stops
    assert "previous token no longer works" in again.stderr
    assert p.post_heartbeat(doc, token=token).status == 401
    assert p.post_heartbeat(doc, token=again.stdout.strip()).status == 200
    assert portal_cli("token", "revoke", "node-a", db=p.db).returncode == 0
    assert p.post_heartbeat(doc, token=again.stdout.strip()).status == 401
    r = portal_cli("token", "revoke", "node-a", db=p.db)
    assert r.returncode == 2 and "node node-a holds no token" in r.stderr
    r = portal_cli("token", "issue", " node-a", db=p.db)  # a node id no heartbeat can carry
    assert r.returncode == 2 and "node id ' node-a': must be non-empty printable" in r.stderr
    r = subprocess.run([*CLI, "token", "list"], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and "--db is required" in r.stderr


def test_the_agents_sender_against_the_portal(start_portal, caplog) -> None:  # type: ignore[no-untyped-def]
    """The agent's HeartbeatSender (in this process, in the node's place) and the real portal:
    its token is accepted; a revoked one is refused, logged once, counted in status."""
    from oarbank_agent.reporting.heartbeat import HeartbeatSender

    p = start_portal()
    token = p.token("node-s")

    def report() -> dict[str, Any]:
        return heartbeat("node-s", service_row(users=1))

    async def run(tok: str, posts: int) -> HeartbeatSender:
        return await until_answered(HeartbeatSender(p.url, report, period_s=0.05, token=tok),
                                    posts, 10)

    s = asyncio.run(run(token, 2))
    assert s.posts_ok >= 2 and s.refusals == {}
    assert p.services()[0]["node_id"] == "node-s"
    p.tokens.clear()
    p.token("node-s")  # a new token: the sender's old one is revoked by the rotation
    s = asyncio.run(run(token, 3))
    (cause,) = s.status()["refused"]
    assert cause["cause"].startswith("HTTP 401: heartbeat: the token is not one")
    assert cause["count"] >= 3
    assert sum("refused this node's report" in r.getMessage() for r in caplog.records) == 1


def test_heartbeats_over_https(start_portal, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import trustme

    from oarbank_agent.reporting.heartbeat import HeartbeatSender

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    key_pem, chain_pem, ca_pem = (tmp_path / "key.pem", tmp_path / "chain.pem",
                                  tmp_path / "ca.pem")
    cert.private_key_pem.write_to_path(str(key_pem))
    cert.cert_chain_pems[0].write_to_path(str(chain_pem))
    ca.cert_pem.write_to_path(str(ca_pem))
    p = start_portal(args=("--tls-cert", str(chain_pem), "--tls-key", str(key_pem)))
    assert p.url.startswith("https://127.0.0.1:")
    token = p.token("node-t")
    report = lambda: heartbeat("node-t", service_row(users=3))  # noqa: E731

    async def one(ca_file: str | None) -> HeartbeatSender:
        return await until_answered(HeartbeatSender(p.url, report, period_s=10, retries=0,
                                                    token=token, ca_file=ca_file), 1, 10)

    ok = asyncio.run(one(str(ca_pem)))
    assert ok.posts_ok == 1, ok.last_error
    bad = asyncio.run(one(None))  # the system's CAs do not know this portal's
    assert bad.posts_ok == 0 and "CERTIFICATE_VERIFY_FAILED" in (bad.last_error or "")
    # plain http to the TLS port is not an answer either
    with socket.create_connection(("127.0.0.1", int(p.url.rsplit(":", 1)[1])), 5) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        s.settimeout(5)
        assert not s.recv(100).startswith(b"HTTP/1.1 200")
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(ca_pem))
    with urllib.request.urlopen(p.url + "/v1/queries/services?module=" + MODULE_ID,
                                context=ctx, timeout=10) as r:
        rows = json.load(r)
    assert [(x["node_id"], x["users"]) for x in rows] == [("node-t", 3)]


@pytest.mark.skipif(sys.platform == "win32", reason="the agent runs on POSIX systems")
def test_the_agent_refuses_a_readable_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("oarbank_x\n")
    token.chmod(0o640)
    r = subprocess.run([sys.executable, "-m", "oarbank_agent", "run", "--state-dir",
                        str(tmp_path / "state"), "--module", "x", "--portal",
                        "http://127.0.0.1:9", "--portal-token-file", str(token)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert f"{token}: mode 0640 lets the group or others read it; chmod 600" in r.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="the agent runs on POSIX systems")
def test_the_agent_refuses_a_bad_ca_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    base = [sys.executable, "-m", "oarbank_agent", "run", "--state-dir", str(tmp_path / "s"),
            "--module", "x"]
    r = subprocess.run([*base, "--portal", "https://127.0.0.1:9", "--portal-ca", str(ca)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and f"--portal-ca {ca}: not a readable PEM CA bundle" in r.stderr
    r = subprocess.run([*base, "--portal", "http://127.0.0.1:9", "--portal-ca", str(ca)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--portal-ca is for an https:// --portal" in r.stderr
