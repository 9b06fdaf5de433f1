"""`oarbank-portal serve` as a real process, over loopback TCP and over its unix socket."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from oarbank_ui.web.app import MAX_BODY

MOD = "dev.example.modelserver"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "modelserver"


def test_heartbeat_then_query_and_pages(start_portal, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    assert p.url.startswith("http://127.0.0.1:")
    r = p.post_heartbeat(make_heartbeat("node-a", make_row(users=2), hostname="gpu-01"))
    got = r.json()
    # alive: the digest a newer agent may name in a short still-alive report next
    assert r.status == 200 and re.fullmatch(r"[0-9a-f]{64}", got.pop("alive")), r.text
    assert got == {"ok": True, "applied": True, "reason": None, "node_id": "node-a",
                   "services": 1}
    p.post_heartbeat(make_heartbeat("node-b", make_row(running=False, ready=False)))
    rows = p.services()
    assert [(x["node_id"], x["state"], x["stopped_reason"], x["users"]) for x in rows] == [
        ("node-a", "ready", None, 2), ("node-b", "stopped", "idle", 0)]
    assert p.services(module="modelserver") == rows  # the short name works too
    assert [x["node_id"] for x in p.services(node_id="node-b")] == ["node-b"]
    assert p.services(service="other") == []

    page = p.get(f"/modules/{MOD}/pages/overview")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "gpu-01" in page.text and "idle" in page.text
    data = p.get("/modules/modelserver/pages/overview?format=json").json()
    (table,) = [v for v in data["components"].values() if v["kind"] == "table"]
    assert [row[0]["text"] for row in table["rows"]] == ["node-a", "node-b"]

    panel = p.get("/nodes/node-b/modules/modelserver/panels/node?format=json").json()
    kinds = {v["kind"]: v for v in panel["components"].values()}
    assert kinds["status"]["value"]["text"] == "stopped"

    index = p.get("/")
    assert index.status == 200
    assert MOD in index.text and "node-a" in index.text
    assert "/nodes/node-b/modules/dev.example.modelserver/panels/node" in index.text
    assert p.get("/static/portal.js").headers["content-type"].startswith("text/javascript")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"{not json", "heartbeat: not JSON"),
        (b"[]", "heartbeat: the report must be a JSON object, got a list"),
        (json.dumps({"node_id": "node-a"}).encode(), "heartbeat: hostname: missing"),
        (json.dumps({"node_id": "node-a", "hostname": "h", "time": 1, "services": [
            {"module": MOD, "service": "model"}]}).encode(), "services[0].lifecycle: missing"),
    ],
)
def test_malformed_heartbeat_is_400_and_changes_nothing(start_portal, http_request, make_heartbeat,  # type: ignore[no-untyped-def]
                                                        make_row, body, reason) -> None:
    p = start_portal()
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=2)))
    before = p.services()
    r = http_request(p.url, "POST", "/v1/heartbeat", raw=body,
                     headers={"Authorization": f"Bearer {p.token('node-a')}"})
    assert r.status == 400
    assert reason in r.json()["error"]
    assert "heartbeat: heartbeat" not in r.json()["error"]  # said once
    assert p.services() == before
    assert reason.split(": ", 1)[-1] in p.log.read_text()  # and the portal's log says why


def test_bad_requests(start_portal, http_request) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    assert http_request(p.url, "GET", "/v1/heartbeat").status == 405
    r = p.get("/v1/queries/services")
    assert r.status == 400 and "module parameter is required" in r.json()["error"]
    r = p.get(f"/v1/queries/services?module={MOD}&colour=red")
    assert r.status == 400 and "unknown parameter 'colour'" in r.json()["error"]
    r = p.get(f"/v1/queries/services?module={MOD}&node_id=a&node_id=b")
    assert r.status == 400 and "given 2 times" in r.json()["error"]
    assert p.get("/modules/nope/pages/overview").status == 404
    assert p.get(f"/modules/{MOD}/pages/nope").status == 404
    assert p.get("/static/../cli.py").status == 404
    # An oversized body is refused from its declared length, before it is read: send only the
    # headers (sending the 2 MiB body races the server's early answer and close: EPIPE).
    host, port = p.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/heartbeat HTTP/1.1\r\nHost: %s:%s\r\n"
                  b"Content-Type: application/json\r\nAuthorization: Bearer %s\r\n"
                  b"Content-Length: %d\r\n\r\n" % (host.encode(), port.encode(),
                                                   p.token("node-a").encode(), MAX_BODY + 1))
        r = http.client.HTTPResponse(s)
        r.begin()
        assert r.status == 413 and "heartbeat: body of" in r.read().decode()
    # Any other request's body (a PUT on the report's path too) has the same checks (one front
    # end) but is no report: its refusal is a plain answer, not counted as a report refused.
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"PUT /v1/heartbeat HTTP/1.1\r\nHost: %s:%s\r\nContent-Length: %d\r\n\r\n"
                  % (host.encode(), port.encode(), MAX_BODY + 1))
        r = http.client.HTTPResponse(s)
        r.begin()
        assert r.status == 413, r.status
        assert r.read().decode() == (
            f'{{"error": "body of {MAX_BODY + 1} bytes is larger than 1 MiB"}}\n')
    refused = [line for line in p.get("/metrics").text.splitlines()
               if line.startswith('oarbank_portal_reports_refused_total{cause="too_large"}')]
    assert refused == ['oarbank_portal_reports_refused_total{cause="too_large"} 1.0'], refused


def test_over_a_unix_socket(start_portal, tmp_path: Path, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    sock = tmp_path / "portal.sock"
    p = start_portal(unix=sock)
    assert p.url == f"unix:{sock}"
    assert p.post_heartbeat(make_heartbeat("node-u", make_row(users=1))).status == 200
    assert [r["node_id"] for r in p.services()] == ["node-u"]
    assert "node-u" in p.get(f"/modules/{MOD}/pages/overview").text
    p.proc.terminate()
    assert p.proc.wait(10) == 0
    assert not sock.exists()  # removed on the way out


def test_stale_socket_file_is_replaced_live_one_refused(start_portal, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sock = tmp_path / "portal.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))
    stale.close()  # a socket file nobody answers on: what a killed portal leaves
    p = start_portal(unix=sock)
    assert p.get("/").status == 200
    second = subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "serve", "--db",
                             str(tmp_path / "b.db"), "--module", str(EXAMPLE), "--unix",
                             str(sock)], capture_output=True, text=True, timeout=30)
    assert second.returncode == 2
    assert "another server is answering on" in second.stderr
    assert p.get("/").status == 200  # the first one is untouched


def test_the_store_survives_a_restart(start_portal, tmp_path: Path, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    p.post_heartbeat(make_heartbeat("node-a", make_row(users=3)))
    p.proc.terminate()
    p.proc.wait(10)
    q = start_portal()  # same --db
    assert [r["users"] for r in q.services()] == [3]


def test_invalid_module_is_refused_at_start(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "oarbank-module.toml").write_text('manifest = 1\n[module]\nid = "x.y"\nversion = 1\n')
    r = subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "serve", "--db",
                        str(tmp_path / "p.db"), "--module", str(bad), "--listen", "127.0.0.1:0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "INVALID" in r.stderr and "module.version" in r.stderr


def test_a_broken_page_file_is_named(start_portal, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    (mod / "ui" / "pages" / "overview.json").write_text("{oops")
    p = start_portal(mod)
    r = p.get(f"/modules/{MOD}/pages/overview")
    assert r.status == 500
    assert "ui/pages/overview.json: not valid JSON at line 1" in r.text
    assert p.get("/nodes/x/modules/modelserver/panels/node").status == 200  # the rest still works


def test_a_cut_services_answer_says_so(start_portal, make_heartbeat, make_row) -> None:  # type: ignore[no-untyped-def]
    p = start_portal()
    for i in range(201):
        assert p.post_heartbeat(make_heartbeat(f"n{i:03d}", make_row())).status == 200
    r = p.get(f"/v1/queries/services?module={MOD}")
    assert r.status == 200 and len(r.json()) == 200
    assert r.headers["x-oarbank-rows-truncated"].startswith("first 200 rows")
    one = p.get(f"/v1/queries/services?module={MOD}&node_id=n200")
    assert len(one.json()) == 1 and "x-oarbank-rows-truncated" not in one.headers
