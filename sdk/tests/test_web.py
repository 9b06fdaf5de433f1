"""oarbank_sdk.web with the real libraries: a FastAPI app under ``serve_asgi`` (uvicorn's HTTP
protocols) in a real service process, reached by httpx (sync and async), requests and the
official openai client through a real connector; every connection a real socketpair handed
over with SCM_RIGHTS by ``endpoint_helpers.FakeAgent`` (the test's stand-in for the agent's
broker; test_web_agent.py in agent/tests runs the same through a real ``oarbank-agent run``
and its sandbox).

The service is ``web_helpers.py start`` (a module's `start` op: it leaves ``serve`` running
with the channel passed on by ``inherit_channel()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import endpoint_helpers as H  # sdk/tests (conftest.py puts it on the path)
import httpx
import pytest
import requests
from platform_marks import fake_agent  # sdk/tests

from oarbank_sdk import web
from oarbank_sdk.endpoint import job as endpoint_job

HELPER = Path(__file__).resolve().parent / "web_helpers.py"


pytestmark = fake_agent


def _read_line(stream, timeout: float) -> str:
    import select
    deadline = time.monotonic() + timeout
    buf = b""
    fd = stream.fileno()
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no line from the service within {timeout}s (got {buf!r})")
        chunk = os.read(fd, 1)
        if not chunk:
            return buf.decode()
        buf += chunk
    return buf.decode()


def _fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


class WebService:
    """One ``web_helpers.py`` service started as the agent starts one, on the FakeAgent's
    channel; ``restart()`` kills its group and starts a new one on a new channel, the
    connector (the attempt's) staying the same, as the agent does."""

    def __init__(self, tmp: Path, http: str, env: dict[str, str] | None = None) -> None:
        self.marks = tmp / "marks"
        self.marks.mkdir()
        self.http = http
        self.extra_env = env or {}
        self.agent = H.FakeAgent(channel=True)
        self.start: subprocess.Popen[bytes] | None = None
        self.daemon_pid = 0
        self.log = tmp / "service.log"

    def launch(self) -> None:
        assert self.agent.channel_child is not None
        child_fd = self.agent.channel_child.fileno()
        env = dict(os.environ, OARBANK_ENDPOINT_CHANNEL=f"fd:{child_fd}",
                   OARBANK_ENDPOINT_FEATURES="ready", WEB_HELPER_MARKS=str(self.marks),
                   WEB_HELPER_HTTP=self.http, **self.extra_env)
        with open(self.log, "ab") as log:
            self.start = subprocess.Popen([sys.executable, str(HELPER), "start"], env=env,
                                          pass_fds=(child_fd,), stdout=subprocess.PIPE,
                                          stderr=log, start_new_session=True)
        self.agent.close_child_end()
        assert self.start.wait(30) == 0
        assert self.start.stdout is not None
        self.daemon_pid = json.loads(_read_line(self.start.stdout, 10))["daemon_pid"]

    def wait_ready(self, lines: int = 1) -> None:
        assert self.agent.wait(lambda: self.agent.ready_lines >= lines, 30), self.log.read_text()

    def kill(self) -> None:
        if self.start is None:
            return
        try:
            os.killpg(self.start.pid, signal.SIGKILL)  # the daemon stays in start's group
        except ProcessLookupError:
            pass
        H.poll(lambda: not _alive(self.daemon_pid), 10)
        assert self.start.stdout is not None
        self.start.stdout.close()
        self.start = None

    def restart(self) -> None:
        """The agent's restart: the old group gone, a new channel, a new daemon."""
        self.kill()
        agent = self.agent
        old = agent.channel
        assert old is not None
        new, child = socket.socketpair()
        old.shutdown(socket.SHUT_RDWR)
        agent.channel, agent.channel_child = new, child
        agent._socks.append(new)
        agent._spawn(agent._read_channel)
        self.launch()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture(params=["h11", "httptools"])
def svc(request, tmp_path, monkeypatch) -> Iterator[WebService]:
    """A ready service (uvicorn's h11 protocol, and httptools'), plus a connector for
    attempt "att-1" in OARBANK_SERVICE_MODEL. No descriptor of this process is left over."""
    base = H.open_fds()
    s = WebService(tmp_path, request.param)
    try:
        s.launch()
        s.wait_ready()
        job_end = s.agent.open_connector("att-1")
        monkeypatch.setenv("OARBANK_SERVICE_MODEL", f"fd:{job_end.detach()}")
        endpoint_job._connector("model")
        yield s
    finally:
        endpoint_job._forget_connectors()
        s.kill()
        s.agent.close()
        extra = H.fds_settle(base)
        assert not extra, f"descriptors leaked: {sorted(extra)}"


def _client() -> httpx.Client:
    return httpx.Client(transport=web.HTTPTransport("model"), base_url="http://model",
                        timeout=30)


# --- the service side -----------------------------------------------------------------------


def test_lifespan_startup_runs_before_ready_and_shutdown_at_channel_eof(svc):
    # `startup` was written by the app's lifespan, `ready` by on_ready, before the ready line.
    assert (svc.marks / "startup").read_text().strip() == str(svc.daemon_pid)
    assert (svc.marks / "ready").exists()
    assert not (svc.marks / "shutdown").exists()
    with _client() as c:
        info = c.get("/info").json()
    assert info["pid"] == svc.daemon_pid
    assert info["client"] == ["attempt-att-1", 0]  # the ASGI scope's client names the attempt
    assert info["host"] == "model"
    svc.agent.close_channel()  # the agent stops the service: EOF on the channel
    assert H.poll(lambda: not _alive(svc.daemon_pid), 15), svc.log.read_text()
    assert (svc.marks / "shutdown").read_text().strip() == str(svc.daemon_pid)
    assert svc.start is not None and svc.start.stdout is not None
    assert json.loads(_read_line(svc.start.stdout, 5)) == {"served": "eof"}


def test_startup_failure_never_says_ready_and_exits_non_zero(tmp_path):
    base = H.open_fds()
    s = WebService(tmp_path, "h11", env={"WEB_HELPER_FAIL_STARTUP": "1"})
    try:
        s.launch()
        assert H.poll(lambda: not _alive(s.daemon_pid), 15)
        assert s.agent.wait(lambda: len(s.agent.hello_pids) == 1, 5)
        assert s.agent.ready_lines == 0
        assert not (s.marks / "ready").exists()
        log = s.log.read_text()
        assert "StartupFailed" in log and "did not load" in log, log
    finally:
        s.kill()
        s.agent.close()
    assert not H.fds_settle(base)


def test_keep_alive_carries_many_requests_over_one_handed_connection(svc):
    with _client() as c:
        pids = {c.get("/info").json()["pid"] for _ in range(30)}
    assert pids == {svc.daemon_pid}
    assert len(svc.agent.connections) == 1  # one connect through the agent for all 30


def test_an_app_that_raises_is_a_500_and_the_service_serves_on(svc):
    with _client() as c:
        r = c.get("/boom")
        assert r.status_code == 500
        assert r.text == "Internal Server Error"
    # uvicorn closes a connection whose app raised (over TCP too); a new one is served.
    with _client() as c:
        assert c.get("/info").json()["pid"] == svc.daemon_pid
    assert "the app raised (GET /boom)" in svc.log.read_text()


def test_server_sent_events_arrive_as_they_are_produced(svc):
    with _client() as c:
        t0 = time.monotonic()
        with c.stream("GET", "/stream", params={"n": 4, "gap": 0.4}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data:"))
            first_at = time.monotonic() - t0
            rest = [line for line in lines if line.startswith("data:")]
        total = time.monotonic() - t0
    assert json.loads(first[5:]) == {"i": 0, "t": pytest.approx(time.time(), abs=30)}
    assert rest[-1] == "data: [DONE]" and len(rest) == 4
    assert first_at < 0.8 < total, (first_at, total)  # the first before the last was made


def test_a_100_mb_request_body_streams_through(svc):
    chunk = os.urandom(1 << 20)
    want = hashlib.sha256(chunk * 100).hexdigest()

    def body() -> Iterator[bytes]:
        for _ in range(100):
            yield chunk

    with _client() as c:
        r = c.post("/digest", content=body())  # chunked: never held whole on this side
    assert r.json() == {"length": 100 << 20, "sha256": want}
    s = web.session("model")
    try:
        r2 = s.post("http://model/digest", data=chunk * 8, timeout=60)  # Content-Length
    finally:
        s.close()
    assert r2.json() == {"length": 8 << 20, "sha256": hashlib.sha256(chunk * 8).hexdigest()}


def test_a_dropped_client_is_cleaned_up_in_the_service(svc):
    with _client() as c:
        c.get("/info")
        before = _fd_count(svc.daemon_pid)
    # A raw connection through the agent: ask for a slow stream, read one event, vanish.
    from oarbank_sdk import service_endpoint as ep
    for _ in range(5):
        sock = ep.connect("model", timeout=10)
        sock.sendall(b"GET /stream?n=1000&gap=0.05 HTTP/1.1\r\nHost: model\r\n\r\n")
        sock.settimeout(10)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.close()
    assert H.poll(lambda: _fd_count(svc.daemon_pid) <= before, 10), \
        (before, _fd_count(svc.daemon_pid))
    with _client() as c:
        assert c.get("/info").json()["pid"] == svc.daemon_pid


# --- the job side: httpx, requests, openai ----------------------------------------------------


def test_httpx_from_threads_shares_one_pool(svc):
    with _client() as c, ThreadPoolExecutor(8) as pool:
        pids = list(pool.map(lambda _: c.get("/info").json()["pid"], range(80)))
    assert set(pids) == {svc.daemon_pid}
    assert 1 <= len(svc.agent.connections) <= 8  # pooled: at most one per thread at once


def test_async_httpx_from_tasks(svc):
    async def main() -> list[int]:
        async with httpx.AsyncClient(transport=web.AsyncHTTPTransport("model"),
                                     base_url="http://model", timeout=30) as c:
            rs = await asyncio.gather(*(c.get("/info") for _ in range(40)))
            async with c.stream("GET", "/stream", params={"n": 3}) as r:
                events = [line async for line in r.aiter_lines() if line.startswith("data:")]
            assert events[-1] == "data: [DONE]" and len(events) == 4
            return [r.json()["pid"] for r in rs]

    assert set(asyncio.run(main())) == {svc.daemon_pid}


def test_requests_session_from_threads_streaming_and_timeouts(svc):
    with web.session("model") as s:
        with ThreadPoolExecutor(8) as pool:
            pids = list(pool.map(lambda _: s.get("http://model/info", timeout=30).json()["pid"],
                                 range(40)))
        assert set(pids) == {svc.daemon_pid}
        with s.get("http://model/stream", params={"n": 3}, stream=True, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith(b"data:")]
        assert events[-1] == b"data: [DONE]" and len(events) == 4
        with pytest.raises(requests.exceptions.ReadTimeout):
            s.get("http://model/slow", params={"s": 5}, timeout=0.3)
        assert s.get("http://model/info", timeout=30).status_code == 200


def test_httpx_read_timeout(svc):
    with _client() as c:
        with pytest.raises(httpx.ReadTimeout):
            c.get("/slow", params={"s": 5}, timeout=0.3)
        assert c.get("/info").status_code == 200


def test_the_openai_client_through_the_agent(svc):
    import openai  # here: its pydantic_core does not load under Wine, where the module skips

    http_client = httpx.Client(transport=web.HTTPTransport("model"))
    client = openai.OpenAI(base_url="http://model/v1", api_key="unused", http_client=http_client)
    try:
        for i in range(5):
            out = client.chat.completions.create(
                model="stand-in", messages=[{"role": "user", "content": f"hello {i}"}])
            assert out.choices[0].message.content == f"hello {i}"[::-1]
    finally:
        client.close()


def test_a_service_restart_in_the_middle_of_a_keep_alive_pool(svc):
    with _client() as c, web.session("model") as s:
        first = {c.get("/info").json()["pid"], s.get("http://model/info", timeout=30).json()["pid"]}
        assert first == {svc.daemon_pid}
        svc.restart()  # the pooled connections now lead to a dead service
        svc.wait_ready(1)
        # The pools see their idle connections closed and take new ones through the agent.
        second = {c.get("/info").json()["pid"], s.get("http://model/info", timeout=30).json()["pid"]}
    assert second == {svc.daemon_pid} and second != first


# --- bad input ----------------------------------------------------------------------------------


def test_a_url_naming_another_host_or_https_is_refused_naming_the_service(svc):
    with _client() as c:
        with pytest.raises(ValueError, match="reaches the endpoint service 'model' only"):
            c.get("http://other/info")
        with pytest.raises(ValueError, match="plain HTTP"):
            c.get("https://model/info")
    with web.session("model") as s:
        with pytest.raises(ValueError, match="reaches the endpoint service 'model' only"):
            s.get("http://other/info")
        with pytest.raises(ValueError, match="plain HTTP"):
            s.get("https://model/info")
    assert svc.agent.connections == []  # nothing was asked of the agent


def test_no_connector_is_a_connect_error_carrying_the_endpoint_code(monkeypatch):
    monkeypatch.delenv("OARBANK_SERVICE_NOPE", raising=False)
    with httpx.Client(transport=web.HTTPTransport("nope")) as c, \
            pytest.raises(httpx.ConnectError, match="no_endpoint") as info:
        c.get("http://nope/")
    cause: BaseException | None = info.value
    while cause is not None and not isinstance(cause, web_endpoint_error()):
        cause = cause.__cause__ or cause.__context__  # httpcore re-raises `from None`
    assert cause is not None and cause.code == "no_endpoint"
    with web.session("nope") as s, pytest.raises(requests.ConnectionError, match="no_endpoint"):
        s.get("http://nope/", timeout=5)


def web_endpoint_error() -> type:
    from oarbank_sdk.service_endpoint import EndpointError
    return EndpointError


def test_bad_arguments_get_clear_errors():
    with pytest.raises(TypeError, match="service must be"):
        web.HTTPTransport(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="service must be the endpoint service's name"):
        web.AsyncHTTPTransport("http://model")
    with pytest.raises(ValueError, match="service must be"):
        web.session("")
    with pytest.raises(TypeError, match="ASGI callable"):
        web.serve_asgi(42)
    with pytest.raises(ValueError, match="port: nothing listens"):
        web.serve_asgi(lambda s, r, w: None, port=8000)
    with pytest.raises(ValueError, match="loop must be one of"):
        web.serve_asgi(lambda s, r, w: None, loop="tokio")
    with pytest.raises(TypeError, match="acceptor must be"):
        web.serve_asgi(lambda s, r, w: None, acceptor=object())  # type: ignore[arg-type]


def test_service_endpoint_still_imports_nothing_of_the_web_extra():
    code = ("import sys; import oarbank_sdk.service_endpoint; "
            "bad = [m for m in ('uvicorn', 'httpx', 'requests', 'fastapi', 'starlette', "
            "'oarbank_sdk.web') if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_accept_with_a_timeout_takes_only_what_has_arrived():
    # What serve_asgi's loop calls when the channel is readable: Acceptor.accept(timeout=0).
    from oarbank_sdk import service_endpoint as ep

    base = H.open_fds()
    agent = H.FakeAgent(channel=True)
    assert agent.channel_child is not None
    acc = ep.Acceptor(channel=f"fd:{agent.channel_child.detach()}")
    job_end = agent.open_connector("att-9")
    try:
        with pytest.raises(TimeoutError):
            acc.accept(timeout=0)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            acc.accept(timeout=0.2)
        assert 0.15 < time.monotonic() - t0 < 3
        peer = H.RawPeer(job_end)
        peer.send({"op": "connect", "pid": os.getpid()})
        conn, attempt = acc.accept(timeout=10)
        assert attempt == "att-9" and acc.open_connections("att-9") == 1
        with pytest.raises(TimeoutError):
            acc.accept(timeout=0)
        agent.send_ended("att-9")  # taken by the next accept, which then finds nothing
        assert H.poll(lambda: _takes_nothing(acc) and acc.open_connections() == 0, 5)
        assert conn.fileno() == -1  # cut
        agent.close_channel()
        with pytest.raises(ep.ChannelClosed):
            acc.accept(timeout=5)
    finally:
        acc.close()
        job_end.close()
        agent.close()
    assert not H.fds_settle(base)


def _takes_nothing(acc) -> bool:
    try:
        acc.accept(timeout=0)
    except TimeoutError:
        return True
    return False


def test_a_plain_starlette_app_served_in_this_process_from_a_thread():
    # serve_asgi in a thread of this process (no signal handlers there), a Starlette app
    # with a lifespan, an acceptor on a real channel; every descriptor back at the end.
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from oarbank_sdk import service_endpoint as ep

    events: list[str] = []

    @contextlib.asynccontextmanager
    async def lifespan(app):
        events.append("startup")
        yield
        events.append("shutdown")

    async def hello(request):
        return JSONResponse({"client": list(request.client or ()), "events": list(events)})

    async def echo(request):
        return PlainTextResponse((await request.body())[::-1])

    app = Starlette(routes=[Route("/", hello), Route("/echo", echo, methods=["POST"])],
                    lifespan=lifespan)
    base = H.open_fds()
    agent = H.FakeAgent(channel=True)
    assert agent.channel_child is not None
    acc = ep.Acceptor(channel=f"fd:{agent.channel_child.detach()}", features="ready")
    served = threading.Thread(target=web.serve_asgi, args=(app, acc),
                              kwargs={"http": "h11", "loop": "asyncio", "log_level": "warning"})
    served.start()
    job_end = agent.open_connector("att-s")
    try:
        assert agent.wait(lambda: agent.ready_lines == 1, 10)
        assert events == ["startup"]
        os.environ["OARBANK_SERVICE_STAR"] = f"fd:{job_end.detach()}"
        with httpx.Client(transport=web.HTTPTransport("star"), base_url="http://star") as c:
            assert c.get("/").json() == {"client": ["attempt-att-s", 0], "events": ["startup"]}
            assert c.post("/echo", content=b"abc").content == b"cba"
        agent.close_channel()
        served.join(15)
        assert not served.is_alive()
        assert events == ["startup", "shutdown"]
    finally:
        os.environ.pop("OARBANK_SERVICE_STAR", None)
        endpoint_job._forget_connectors()
        job_end.close()  # detached once the client holds it: then a no-op
        agent.close_channel()
        served.join(15)
        acc.close()
        agent.close()
    assert not H.fds_settle(base)
