"""``oarbank_sdk.service_endpoint`` is a superset of upstream's public API (contract section 3):
one test per row of the tables in sdk/README.md ("Upstream's API on ours").

Upstream's public names, signatures and error codes are data (``upstream_service_endpoint.json``
beside this file, read from upstream's source): ``test_every_upstream_name_is_ours_compatibly``
checks ours against it, ``test_the_readme_tables_list_exactly_upstreams_names_and_codes`` the
README against it.

The service is a real process written with upstream's names and keywords only (``SERVICE``
below); the agent's role is played by ``endpoint_helpers.FakeAgent`` over real socketpairs and
SCM_RIGHTS, which lets a test choose the attempt ids (integers, as agents send them, or strings,
as older ones did).
"""

from __future__ import annotations

import ast
import dataclasses
import http.client
import importlib
import inspect
import io
import json
import os
import re
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import endpoint_helpers as H  # sdk/tests (conftest.py puts it on the path)
import pytest
from platform_marks import fake_agent  # sdk/tests

from oarbank_sdk import service_endpoint as ep
from oarbank_sdk.conform import host
from oarbank_sdk.endpoint import errors as endpoint_errors
from oarbank_sdk.endpoint import job as endpoint_job

HERE = Path(__file__).resolve().parent
UPSTREAM = json.loads((HERE / "upstream_service_endpoint.json").read_text(encoding="utf-8"))
README = HERE.parent / "README.md"

pytestmark = fake_agent

# A service written against upstream's API: keywords as upstream names them.
SERVICE = r'''
import json, os, subprocess, sys
from http.server import BaseHTTPRequestHandler
from oarbank_sdk import service_endpoint as ep

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        attempt = self.connection.attempt  # ours: the id as it came (upstream: int only)
        child = subprocess.run([sys.executable, "-c",
                                "import os; print(os.environ.get('OARBANK_ENDPOINT_CHANNEL'))"],
                               capture_output=True, text=True).stdout.strip()
        body = json.dumps({"attempt": attempt, "attempt_type": type(attempt).__name__,
                           "client": list(self.client_address),
                           "server_is_acceptor": isinstance(self.server, ep.Acceptor),
                           "env": os.environ.get("OARBANK_ENDPOINT_CHANNEL"),
                           "child_env": child}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Mixed-Case", "yes")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_POST(self):
        # Echo the body as it came: by Content-Length, or chunked (a streamed body).
        if "chunked" in self.headers.get("Transfer-Encoding", ""):
            data = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                chunk = self.rfile.read(size + 2)[:size]
                if not size:
                    break
                data += chunk
        else:
            data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = json.dumps({"body": data.decode(),
                           "transfer_encoding": self.headers.get("Transfer-Encoding"),
                           "content_length": self.headers.get("Content-Length")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

if sys.argv[1] == "start":
    proc = subprocess.Popen([sys.executable, __file__, "serve"], **ep.inherit_channel())
    print(json.dumps({"ok": True, "daemon_pid": proc.pid}), flush=True)
else:
    acc = ep.Acceptor(max_per_attempt=2)
    ep.serve_http(handler=Handler, acceptor=acc)
'''


def _read_line(stream, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream.fileno()], [], [], left)[0]:
            raise AssertionError(f"no line from the service within {timeout}s (got {buf!r})")
        chunk = os.read(stream.fileno(), 1)
        if not chunk:
            break
        buf += chunk
    return buf.decode()


@pytest.fixture
def service(tmp_path, monkeypatch):
    """The upstream-style service, started as an agent starts one; connectors for attempt 7
    (an integer, as agents send) as "model" and "att-2" (a string) as "other"."""
    base = H.open_fds()
    prog = tmp_path / "upstream_style_service.py"
    prog.write_text(SERVICE)
    agent = H.FakeAgent(channel=True)
    child_fd = agent.channel_child.fileno()
    env = dict(os.environ, OARBANK_ENDPOINT_CHANNEL=f"fd:{child_fd}")
    start = subprocess.Popen([sys.executable, str(prog), "start"], env=env,
                             pass_fds=(child_fd,), stdout=subprocess.PIPE,
                             start_new_session=True)
    agent.close_child_end()
    try:
        assert start.wait(30) == 0
        daemon_pid = json.loads(_read_line(start.stdout, 10))["daemon_pid"]
        assert agent.wait(lambda: agent.hello_pids == [daemon_pid])
        monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{agent.open_connector(7).detach()}")
        monkeypatch.setenv("OARBANK_SERVICE_OTHER", f"fd:{agent.open_connector('att-2').detach()}")
        for name in ("model", "other"):
            endpoint_job._connector(name)  # adopt them now: teardown closes them
        yield agent
    finally:
        endpoint_job._forget_connectors()
        agent.close()
        host.end_group(start.pid, grace_s=0)  # the daemon too, and waits until it is gone
        start.stdout.close()
        extra = H.fds_settle(base)
        assert not extra, f"descriptors leaked: {sorted(extra)}"


def _params(fn) -> dict[str, object]:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items()}


# --- job side --------------------------------------------------------------------------------


def test_available_says_whether_the_attempt_has_a_connector(service, monkeypatch):
    assert ep.available("model") is True
    monkeypatch.delenv("OARBANK_SERVICE_NONE", raising=False)
    assert ep.available("none") is False
    r, w = os.pipe()
    try:
        monkeypatch.setenv("OARBANK_SERVICE_PIPE", f"fd:{r}")  # open, but not a stream socket
        assert ep.available("pipe") is False
    finally:
        os.close(r)
        os.close(w)
    monkeypatch.setenv("OARBANK_SERVICE_GONE", f"fd:{r}")  # closed now
    assert ep.available("gone") is False
    monkeypatch.setenv("OARBANK_SERVICE_JUNK", "handle:12")
    assert ep.available("junk") is False


def test_request_takes_upstreams_parameters_and_600_s_default(service):
    assert _params(ep.request) == {"service": inspect.Parameter.empty,
                                   "method": inspect.Parameter.empty,
                                   "path": inspect.Parameter.empty, "body": None,
                                   "headers": None, "timeout": 600.0}
    r = ep.request(service="model", method="GET", path="/", body=None, headers=None)
    assert r.status == 200 and r.json()["attempt"] == 7


def test_response_headers_answer_lower_case_names(service):
    r = ep.request("model", "GET", "/")
    assert r.headers["x-mixed-case"] == "yes" and r.headers["X-Mixed-Case"] == "yes"
    assert r.headers.get("content-type") == "application/json"
    names = list(r.headers.keys())
    assert names and all(n == n.lower() for n in names), names
    assert dict(r.headers.items())["x-mixed-case"] == "yes"
    assert isinstance(r.body, bytes) and r.json()["attempt_type"] == "int"
    # A dict, as upstream's: it serialises, and compares with one in any case.
    assert isinstance(r.headers, dict) and "X-MIXED-CASE" in r.headers
    assert json.loads(json.dumps(r.headers))["x-mixed-case"] == "yes"
    assert r.headers == {k.upper(): v for k, v in r.headers.items()}


def test_repeated_headers_are_joined_and_kept_apart():
    msg = http.client.HTTPMessage()
    msg["Set-Thing"] = "a"
    msg["set-thing"] = "b"
    msg["Content-Type"] = "text/plain; charset=latin-1"
    r = ep.Response(200, msg, "é".encode("latin-1"))
    assert r.headers["SET-THING"] == "a, b" and r.headers.get_all("set-thing") == ["a", "b"]
    assert r.headers.get_all("nope") is None and r.headers.get("nope", 1) == 1
    assert r.text == "é" and json.dumps(r.headers)
    r.headers["X-New"] = "1"
    assert list(r.headers) == ["set-thing", "content-type", "x-new"]
    del r.headers["X-NEW"]
    assert "x-new" not in r.headers


def test_http_connection_defaults_to_no_timeout_and_keeps_alive(service):
    assert _params(ep.HTTPConnection) == {"service": inspect.Parameter.empty, "timeout": None}
    conn = ep.HTTPConnection("model")
    try:
        assert conn.timeout is None
        for _ in range(2):
            conn.request("GET", "/")
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["attempt"] == 7
    finally:
        conn.close()
    assert service.wait(lambda: len(service.received) == 1)  # one brokered connection


def test_endpoint_error_is_a_runtime_error_with_code_and_detail(service):
    assert issubclass(ep.EndpointError, RuntimeError)
    service.refusals.append(("service_unavailable", "not ready"))
    with pytest.raises(RuntimeError) as info:
        ep.request("model", "GET", "/")
    assert isinstance(info.value, ep.EndpointError)
    assert (info.value.code, info.value.detail) == ("service_unavailable", "not ready")


def test_a_closed_connector_raises_code_closed(fd_pair):
    agent_end, monkeypatch = fd_pair
    agent_end.shutdown(socket.SHUT_RDWR)
    with pytest.raises(ep.EndpointError) as info:
        ep.connect("model", timeout=5)
    assert info.value.code == "closed"
    assert isinstance(info.value, ep.ChannelClosed)  # ours: a subclass to catch it by type


@pytest.fixture
def fd_pair(monkeypatch):
    base = H.open_fds()
    agent_end, job_end = socket.socketpair()
    monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{job_end.detach()}")
    yield agent_end, monkeypatch
    endpoint_job._forget_connectors()
    agent_end.close()
    assert not H.fds_settle(base)


# --- service side ------------------------------------------------------------------------------


def test_acceptor_yields_the_attempt_id_as_it_came(service):
    assert ep.request("model", "GET", "/").json()["attempt"] == 7  # integer in, integer out
    r = ep.request("other", "GET", "/").json()
    assert (r["attempt"], r["attempt_type"]) == ("att-2", "str")


def test_acceptor_max_per_attempt_caps_open_connections(service):
    assert _params(ep.Acceptor)["max_per_attempt"] == 64
    # The service runs Acceptor(max_per_attempt=2): a third connection cuts the oldest.
    socks = [ep.connect("model", timeout=5) for _ in range(3)]
    try:
        socks[0].settimeout(5)
        assert socks[0].recv(1) == b""  # cut by the service
        socks[2].sendall(b"GET / HTTP/1.1\r\nHost: model\r\nConnection: close\r\n\r\n")
        socks[2].settimeout(5)
        head = b""
        while len(head) < 12 and (chunk := socks[2].recv(12 - len(head))):
            head += chunk
        assert head == b"HTTP/1.1 200"  # the newest still served
    finally:
        for s in socks:
            s.close()
    with pytest.raises(ValueError, match="max_per_attempt must be a positive integer, got 0"):
        ep.Acceptor(0)


def test_serve_http_and_inherit_channel_take_upstreams_names():
    assert list(_params(ep.serve_http)) == ["handler", "acceptor"]
    assert _params(ep.serve_http)["acceptor"] is None
    assert _params(ep.inherit_channel) == {}


def test_the_channel_variable_leaves_the_environment_once_the_acceptor_holds_it(service):
    r = ep.request("model", "GET", "/").json()
    assert r["env"] is None  # the daemon's own os.environ
    assert r["child_env"] == "None"  # and so its children do not inherit the name


def test_our_additions_are_kept():
    for name in ("inherit_connector", "EndpointSocket", "FEATURES_ENV",
                 "CONNECTIONS_PER_ATTEMPT", "REQUEST_TIMEOUT_S"):
        assert name in ep.__all__ and hasattr(ep, name), name
    assert "channel" in inspect.signature(ep.Acceptor).parameters  # keyword-only, ours
    assert inspect.signature(ep.Acceptor).parameters["channel"].kind is inspect.Parameter.KEYWORD_ONLY
    for name in ("__enter__", "open_connections", "ready"):
        assert hasattr(ep.Acceptor, name), name
    assert _params(ep.connect) == {"service": inspect.Parameter.empty, "timeout": None}
    assert {f.name for f in dataclasses.fields(ep.Response)} >= {"reason"}
    assert hasattr(ep.Response, "text")


# --- upstream's names as data ------------------------------------------------------------------

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _resolve(dotted: str) -> type:
    if dotted in ("object", "RuntimeError"):
        return {"object": object, "RuntimeError": RuntimeError}[dotted]
    if "." not in dotted:
        return getattr(ep, dotted)
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _signature_problems(name: str, obj: object, params: list[dict]) -> list[str]:
    """Where a call written for upstream's ``name(params...)`` would not bind the same on ours."""
    sig = inspect.signature(obj)  # a class: its constructor's, without self
    ours = list(sig.parameters.values())
    positional = [p for p in ours if p.kind in _POSITIONAL]
    problems = []
    if [p.name for p in positional[:len(params)]] != [d["name"] for d in params]:
        problems.append(f"{name}: positional parameters {[p.name for p in positional]}, "
                        f"upstream's start {[d['name'] for d in params]}")
        return problems
    for d, p in zip(params, positional[:len(params)], strict=True):
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            problems.append(f"{name}({p.name}): not passable by keyword as on upstream's")
        if "default" in d:
            want = ast.literal_eval(d["default"])
            if p.default is inspect.Parameter.empty or p.default != want or (
                    want is None) != (p.default is None):
                problems.append(f"{name}({p.name}): default {p.default!r}, upstream's {want!r}")
        elif "default_type" in d:
            if not isinstance(p.default, _resolve(d["default_type"]) if d["default_type"] != "str"
                              else str):
                problems.append(f"{name}({p.name}): needs a {d['default_type']} default")
        elif "default_factory" in d:
            fields = {f.name: f for f in dataclasses.fields(obj)}  # type: ignore[arg-type]
            factory = fields[p.name].default_factory
            if factory is dataclasses.MISSING or factory() != {"dict": {}, "list": []}[
                    d["default_factory"]]:
                problems.append(f"{name}({p.name}): no empty {d['default_factory']} default")
    for p in ours[len(params):]:
        if p.default is inspect.Parameter.empty and p.kind not in _VARIADIC:
            problems.append(f"{name}: ours requires {p.name!r}, which upstream's callers omit")
    return problems


def _instance(name: str, monkeypatch) -> object | None:
    """One instance of upstream's class ``name`` made the way an upstream caller makes it."""
    if name == "EndpointError":
        return ep.EndpointError("some_code", "some detail")
    if name == "ChannelClosed":
        return ep.ChannelClosed()
    if name == "HTTPConnection":
        return ep.HTTPConnection("model")
    if name == "Response":
        return ep.Response(200)
    if name == "Acceptor":
        agent_end, service_end = socket.socketpair()
        monkeypatch.setenv("OARBANK_ENDPOINT_CHANNEL", f"fd:{service_end.detach()}")
        acc = ep.Acceptor()
        agent_end.close()
        return acc
    return None


def test_every_upstream_name_is_ours_compatibly(monkeypatch):
    problems = []
    for name, d in UPSTREAM["names"].items():
        if not hasattr(ep, name):
            problems.append(f"{name}: missing")
            continue
        if name not in ep.__all__:
            problems.append(f"{name}: not in __all__")
        ours = getattr(ep, name)
        kind = d["kind"]
        if kind == "constant" and (ours != d["value"] or type(ours) is not type(d["value"])):
            problems.append(f"{name} = {ours!r}, upstream's {d['value']!r}")
        elif kind == "flag" and ours is not (sys.platform == d["true_when_sys_platform"]):
            problems.append(f"{name} = {ours!r} on {sys.platform}")
        elif kind in ("function", "class"):
            if not callable(ours):
                problems.append(f"{name}: not callable")
                continue
            if kind == "class":
                if not inspect.isclass(ours):
                    problems.append(f"{name}: not a class")
                    continue
                problems += [f"{name}: not a subclass of {b}" for b in d["bases"]
                             if not issubclass(ours, _resolve(b))]
                if d.get("dataclass") and not dataclasses.is_dataclass(ours):
                    problems.append(f"{name}: not a dataclass")
                problems += [f"{name}.{m}: missing" for m in d.get("methods", ())
                             if not callable(getattr(ours, m, None))]
            problems += _signature_problems(name, ours, d["params"])
            obj = _instance(name, monkeypatch) if kind == "class" else None
            if obj is not None:
                problems += [f"{name}().{a}: missing" for a in d.get("attributes", ())
                             if not hasattr(obj, a)]
                if "code" in d and getattr(obj, "code", None) != d["code"]:
                    problems.append(f"{name}().code = {obj.code!r}, upstream's {d['code']!r}")
                if hasattr(obj, "close"):
                    obj.close()
        elif kind not in ("constant", "flag"):
            problems.append(f"{name}: unknown kind {kind!r} in the data")
    assert problems == []


def test_the_data_is_what_it_claims(tmp_path):
    # The check above must be able to fail: a module missing a name, with a moved parameter
    # or another default, is caught by the same functions.
    assert _signature_problems("f", lambda service, timeout=5: None,
                               [{"name": "service"}, {"name": "timeout", "default": "600"}])
    assert _signature_problems("f", lambda method, service: None,
                               [{"name": "service"}, {"name": "method"}])
    assert _signature_problems("f", lambda service, extra: None, [{"name": "service"}])
    assert not _signature_problems("f", lambda service, timeout=600.0, *, more=1: None,
                                   [{"name": "service"}, {"name": "timeout", "default": "600"}])
    assert len(UPSTREAM["names"]) == 16 and len(UPSTREAM["error_codes"]) == 6


def _render(name: str, d: dict) -> str:
    """Upstream's name as the README's first column writes it."""
    if d["kind"] == "constant":
        return f"{name} = {json.dumps(d['value'])}"
    if d["kind"] == "flag":
        return name
    parts = []
    for p in d["params"]:
        if "default" in p:
            parts.append(f"{p['name']}={p['default']}")
        elif "default_factory" in p:
            parts.append(f"{p['name']}={ {'dict': '{}', 'list': '[]'}[p['default_factory']] }")
        elif "default_type" in p:
            parts.append(f"{p['name']}=...")
        else:
            parts.append(p["name"])
    return f"{name}({', '.join(parts)})"


def _readme_tables() -> list[list[list[str]]]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Upstream's API on ours", 1)[1].split("\n## ", 1)[0]
    tables: list[list[list[str]]] = []
    in_table = False
    for line in section.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if not in_table:
                tables.append([])
                in_table = True
            if not set(line) <= set("|- "):
                tables[-1].append(cells)
        else:
            in_table = False
    return [t[1:] for t in tables]  # without the header row


def _spans(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_readme_tables_list_exactly_upstreams_names_and_codes():
    names, codes = _readme_tables()
    listed = [_spans(row[0])[0] for row in names if not row[0].startswith("ours only")]
    assert sorted(listed) == sorted(_render(n, d) for n, d in UPSTREAM["names"].items())
    [ours_only] = [row for row in names if row[0].startswith("ours only")]
    upstream_names = set(UPSTREAM["names"])
    assert set(_spans(ours_only[0])) == set(ep.__all__) - upstream_names
    listed_codes = [_spans(row[0])[0] for row in codes if not row[0].startswith("ours only")]
    assert sorted(listed_codes) == sorted(UPSTREAM["error_codes"])
    [ours_codes] = [row for row in codes if row[0].startswith("ours only")]
    assert set(_spans(ours_codes[0])) == set(endpoint_errors.LOCAL_CODES) - set(
        UPSTREAM["error_codes"])
    # Every row names tests of this file that exist.
    for row in names + codes:
        tests = [t for t in _spans(row[-1]) if not t.endswith(".py")]
        assert tests, row
        for t in tests:
            assert callable(globals().get(f"test_{t}")), f"README names test_{t}: no such test"


# --- rows of the tables ---------------------------------------------------------------------


def test_upstream_constants_have_upstreams_values():
    assert ep.CHANNEL_ENV == "OARBANK_ENDPOINT_CHANNEL"
    assert ep.PREFIX == "OARBANK_SERVICE_" and ep.env_name("my_svc") == ep.PREFIX + "MY_SVC"
    assert ep.MAX_LINE == 4096 == ep.MAX_LINE
    assert ep.MAX_PER_ATTEMPT == ep.CONNECTIONS_PER_ATTEMPT == 64
    assert ep.WINDOWS is (sys.platform == "win32")


def test_channel_closed_needs_no_detail():
    exc = ep.ChannelClosed()
    assert isinstance(exc, ep.EndpointError) and exc.code == "closed" and exc.detail
    assert ep.ChannelClosed("gone").detail == "gone"
    assert ep.ChannelClosed(detail="gone").detail == "gone"


def test_response_takes_upstreams_positional_order():
    r = ep.Response(200, {"Content-Type": "text/plain"}, b"x")
    assert (r.status, r.body, r.headers["content-type"], r.reason) == (200, b"x", "text/plain", "")
    assert r.headers == {"content-type": "text/plain"}
    assert ep.Response(200) == ep.Response(200, {}, b"")  # upstream's defaults, dataclass equality
    assert ep.Response(404).headers == {} and ep.Response(404).body == b""
    assert ep.Response(200, {}, b'{"a": 1}', "OK").json() == {"a": 1}
    assert ep.Response(200, {}, b"x", reason="OK") == ep.Response(200, {}, b"x")  # not compared
    assert ep.Response(200, {}, b"x") != ep.Response(200, {}, b"y")
    assert ep.Response(status=201, headers={"A": "b"}, body=b"").headers["a"] == "b"


def test_request_sends_a_file_body_as_http_client_does(service, tmp_path):
    f = tmp_path / "prompt.txt"
    f.write_bytes(b"from a file")
    with open(f, "rb") as body:
        r = ep.request("model", "POST", "/", body)
    assert r.status == 200
    assert r.json() == {"body": "from a file", "transfer_encoding": "chunked",
                        "content_length": None}
    with open(f, "rb") as body:  # a Content-Length given: sent as is, not chunked
        r = ep.request("model", "POST", "/", body, headers={"Content-Length": "11"})
    assert r.json()["body"] == "from a file" and r.json()["content_length"] == "11"
    assert ep.request("model", "POST", "/", io.BytesIO(b"bytes io")).json()["body"] == "bytes io"
    assert ep.request("model", "POST", "/", iter([b"it", b"er"])).json()["body"] == "iter"
    assert ep.request("model", "POST", "/", bytearray(b"ba")).json()["body"] == "ba"
    with pytest.raises(TypeError, match="not int"):
        ep.request("model", "POST", "/", 42)


def test_serve_http_handlers_see_upstreams_client_address_and_server(service):
    r = ep.request("model", "GET", "/").json()
    assert r["client"] == ["attempt-7", 0] and r["server_is_acceptor"] is True
    assert ep.request("other", "GET", "/").json()["client"] == ["attempt-att-2", 0]


# --- error codes --------------------------------------------------------------------------------


def _answering_connector(monkeypatch, reply: bytes | None, attach: int | None = None) -> H.RawPeer:
    """OARBANK_SERVICE_MODEL: a connector whose agent has already written ``reply`` (or
    closed, for None)."""
    endpoint_job._forget_connectors()
    agent_end, job_end = socket.socketpair()
    monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{job_end.detach()}")
    peer = H.RawPeer(agent_end)
    if reply is None:
        agent_end.shutdown(socket.SHUT_RDWR)
    else:
        peer.send(reply, attach)
    return peer


def _code(call) -> str:
    with pytest.raises(ep.EndpointError) as info:
        call()
    return info.value.code


def test_error_codes_are_upstreams(monkeypatch):
    base = H.open_fds()
    job_calls = {"connect": lambda: ep.connect("model"),
                 "request": lambda: ep.request("model", "GET", "/")}
    service_calls = {"Acceptor": ep.Acceptor, "inherit_channel": ep.inherit_channel}
    seen: dict[str, set[str]] = {}

    def expect(code: str, what: str, call) -> None:
        assert _code(call) == code, what
        seen.setdefault(code, set()).add(what)

    try:
        for what, call in job_calls.items():
            monkeypatch.delenv("OARBANK_SERVICE_MODEL", raising=False)
            expect("no_endpoint", what, call)
            monkeypatch.setenv("OARBANK_SERVICE_MODEL", "")
            expect("no_endpoint", what, call)
            for bad in ("fd:abc", "handle:3", "3"):
                monkeypatch.setenv("OARBANK_SERVICE_MODEL", bad)
                expect("bad_endpoint", what, call)
            peers = [_answering_connector(monkeypatch, {"ok": False, "detail": "no"})]
            with pytest.raises(ep.EndpointError) as info:
                call()
            assert (info.value.code, info.value.detail) == ("refused", "no")
            seen.setdefault("refused", set()).add(what)
            peers.append(_answering_connector(monkeypatch, None))
            with pytest.raises(ep.ChannelClosed):
                call()
            seen.setdefault("closed", set()).add(what)
            for peer in peers:
                peer.close()
        for reply in (b"x" * (ep.MAX_LINE + 10) + b"\n", {"ok": True, "conn": 1}):
            peer = _answering_connector(monkeypatch, reply)
            expect("bad_message", "connect", job_calls["connect"])
            peer.close()
        monkeypatch.setenv("OARBANK_SERVICE_MODEL", "fd:abc")
        assert ep.available("model") is False  # ours: stricter than upstream's (see README)
        for what, call in service_calls.items():
            monkeypatch.delenv("OARBANK_ENDPOINT_CHANNEL", raising=False)
            expect("no_channel", what, call)
            monkeypatch.setenv("OARBANK_ENDPOINT_CHANNEL", "fd:x")
            expect("bad_endpoint", what, call)
        # Acceptor.accept(): closed at end of file; a malformed line (upstream: bad_message) is
        # skipped and counted, so the next connection still arrives.
        agent_end, service_end = socket.socketpair()
        monkeypatch.setenv("OARBANK_ENDPOINT_CHANNEL", f"fd:{service_end.detach()}")
        acc = ep.Acceptor()
        peer = H.RawPeer(agent_end)
        assert peer.read() == {"op": "hello", "pid": os.getpid()}
        job_end, handed = socket.socketpair()
        peer.send(b"y" * (ep.MAX_LINE + 10) + b"\n")
        peer.send({"op": "connection", "conn": 1, "attempt": 3}, attach=handed.fileno())
        handed.close()
        conn, attempt = acc.accept()
        assert attempt == 3 and acc.malformed == 1
        conn.close()
        job_end.close()
        agent_end.shutdown(socket.SHUT_RDWR)
        with pytest.raises(ep.ChannelClosed):
            acc.accept()
        seen.setdefault("closed", set()).add("Acceptor.accept")
        acc.close()
        peer.close()
    finally:
        endpoint_job._forget_connectors()
    for code, d in UPSTREAM["error_codes"].items():
        expected = set(d["raised_by"]) - {"Acceptor.accept"} if code == "bad_message" else set(
            d["raised_by"])
        assert seen.get(code, set()) >= expected, (code, seen)
    assert set(seen) <= set(endpoint_errors.LOCAL_CODES)
    # ours only: timeout
    peer = _answering_connector(monkeypatch, b"")
    assert _code(lambda: ep.connect("model", timeout=0.2)) == "timeout"
    endpoint_job._forget_connectors()
    peer.close()
    assert not H.fds_settle(base)
