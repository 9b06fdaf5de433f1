"""HeartbeatSender against real HTTP servers on loopback and on a unix socket.

The servers here are small stand-ins for the portal (they record what arrives and answer what a
test tells them to), so each test can make the portal slow, down or refusing; the real portal
receiving real agents is covered by ui-pages/tests/test_browser_agents.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import socketserver
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from oarbank_agent.reporting.heartbeat import HeartbeatSender, PortalURL


class Recorder:
    """What the stand-in portal received, and what it answers next."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str, dict[str, Any]]] = []  # (path, content-type, body)
        self.answers: list[tuple[int, dict[str, Any]]] = []  # consumed first; then 200
        self.lock = threading.Lock()

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [b for _, _, b in self.posts]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802
        rec: Recorder = self.server.recorder  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with rec.lock:
            rec.posts.append((self.path, self.headers.get("Content-Type", ""), body))
            status, doc = rec.answers.pop(0) if rec.answers else (200, {"ok": True})
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def address_string(self) -> str:
        return "test"


class _TCPServer(ThreadingHTTPServer):
    daemon_threads = True


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, _ = self.socket.accept()
        return conn, ("unix", 0)


@contextlib.contextmanager
def serving(server: socketserver.BaseServer, rec: Recorder):  # type: ignore[no-untyped-def]
    server.recorder = rec  # type: ignore[attr-defined]
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    t.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


@contextlib.contextmanager
def portal_tcp(port: int = 0):  # type: ignore[no-untyped-def]
    rec = Recorder()
    with serving(_TCPServer(("127.0.0.1", port), _Handler), rec) as srv:
        yield rec, f"http://127.0.0.1:{srv.server_address[1]}"


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)


def make_report() -> Any:
    seq = {"n": 0}

    def report() -> dict[str, Any]:
        seq["n"] += 1
        return {"node_id": "n1", "hostname": "h", "time": time.time(), "seq": seq["n"],
                "services": []}

    return report, seq


async def wait_until(cond: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


class Ticker:
    """Measures how long the loop was unable to run a 10 ms timer: a blocked loop shows here."""

    def __init__(self) -> None:
        self.max_gap = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            self.max_gap = max(self.max_gap, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._task is not None
        self._task.cancel()


def test_posts_at_once_then_every_period() -> None:
    async def main() -> None:
        report, _ = make_report()
        with portal_tcp() as (rec, url):
            s = HeartbeatSender(url, report, period_s=0.2)
            s.start()
            await wait_until(lambda: s.posts_ok >= 3)
            await s.aclose()
        path, ctype, body = rec.posts[0]
        assert path == "/v1/heartbeat"
        assert ctype == "application/json"
        assert body["node_id"] == "n1" and body["services"] == []
        assert s.posts_ok >= 3 and s.posts_failed == 0

    asyncio.run(main())


def test_burst_of_changes_is_one_post() -> None:
    async def main() -> None:
        report, _ = make_report()
        with portal_tcp() as (rec, url):
            s = HeartbeatSender(url, report, period_s=60, debounce_s=0.3)
            s.start()
            await wait_until(lambda: len(rec.posts) == 1)  # the post at start
            for _ in range(5):  # a burst: five state changes within 0.1 s
                for _ in range(10):
                    s.notify_change()
                await asyncio.sleep(0.02)
            await wait_until(lambda: s.posts_ok >= 2)
            assert s.posts_ok == 2, f"{s.posts_ok} posts: the burst was not folded into one"
            # The second post is done and the sender waits again (the period is 60 s): only a
            # change noted since that post began (the event it cleared then) would post a
            # third time, and the burst was over before it.
            assert not s._changed.is_set(), "a change of the burst is left for a third post"
            await s.aclose()
        assert len(rec.posts) == 2
        # The post after the burst carries the state after the whole burst (a fresh report).
        assert rec.bodies()[1]["seq"] == 2

    asyncio.run(main())


def test_change_from_another_thread_is_posted() -> None:
    async def main() -> None:
        report, _ = make_report()
        with portal_tcp() as (rec, url):
            s = HeartbeatSender(url, report, period_s=60, debounce_s=0.05)
            s.start()
            await wait_until(lambda: len(rec.posts) == 1)
            t = threading.Thread(target=s.notify_change)
            t.start()
            t.join()
            await wait_until(lambda: len(rec.posts) == 2)
            await s.aclose()

    asyncio.run(main())


def test_unix_socket_portal(tmp_path: Path) -> None:
    async def main() -> None:
        report, _ = make_report()
        path = str(tmp_path / "portal.sock")
        rec = Recorder()
        with serving(_UnixServer(path, _Handler), rec):
            s = HeartbeatSender(f"unix:{path}", report, period_s=60)
            s.start()
            await wait_until(lambda: len(rec.posts) == 1)
            await s.aclose()
        assert rec.posts[0][0] == "/v1/heartbeat"
        assert rec.bodies()[0]["node_id"] == "n1"

    asyncio.run(main())


def test_portal_down_then_back(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens: the loop keeps running, one readable warning, delivery once it is back,
    and what is delivered then is the newest report."""
    caplog.set_level(logging.INFO, logger="oarbank_agent.reporting.heartbeat")

    async def main() -> None:
        report, _ = make_report()
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        s = HeartbeatSender(url, report, period_s=0.2, retries=2, backoff_initial_s=0.05,
                            timeout_s=1.0)
        with Ticker() as ticker:
            s.start()
            await wait_until(lambda: s.posts_failed >= 6)
            assert s.posts_ok == 0
            with portal_tcp(port) as (rec, _):
                await wait_until(lambda: s.posts_ok >= 1)
                await s.aclose()
        assert ticker.max_gap < 0.5, f"the loop was blocked for {ticker.max_gap:.2f} s"
        # Every attempt built a fresh report: what arrived first is the one made after all the
        # failed attempts, not an old one resent.
        assert rec.bodies()[0]["seq"] == s.posts_failed + 1
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        msg = warnings[0].getMessage()
        assert f"cannot reach portal {url}" in msg and "keeps running jobs" in msg
        assert any("reachable again" in r.getMessage() for r in caplog.records
                   if r.levelno == logging.INFO)

    asyncio.run(main())


def test_slow_portal_never_blocks_the_loop() -> None:
    """A portal that accepts and never answers: each post ends at timeout_s, the loop runs."""

    async def main() -> None:
        report, _ = make_report()
        lsock = socket.socket()
        lsock.bind(("127.0.0.1", 0))
        lsock.listen(16)  # the kernel accepts; nobody ever reads or answers
        try:
            url = f"http://127.0.0.1:{lsock.getsockname()[1]}"
            s = HeartbeatSender(url, report, period_s=0.1, timeout_s=0.2, retries=1,
                                backoff_initial_s=0.05)
            with Ticker() as ticker:
                s.start()
                await wait_until(lambda: s.posts_failed >= 3)
                t0 = time.monotonic()
                await s.aclose()
                closed_in = time.monotonic() - t0
            assert s.posts_ok == 0
            assert s.last_error is not None and "no answer within" in s.last_error
            assert ticker.max_gap < 0.5, f"the loop was blocked for {ticker.max_gap:.2f} s"
            assert closed_in < 1.0
        finally:
            lsock.close()

    asyncio.run(main())


def test_refused_report_is_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="oarbank_agent.reporting.heartbeat")

    async def main() -> None:
        report, _ = make_report()
        with portal_tcp() as (rec, url):
            rec.answers.append((400, {"error": "heartbeat: services[0].users: missing"}))
            s = HeartbeatSender(url, report, period_s=0.4, retries=3, backoff_initial_s=0.01)
            s.start()
            await wait_until(lambda: len(rec.posts) >= 2)  # the refused one, then the next period
            await s.aclose()
            first, second = rec.posts[0], rec.posts[1]
        assert second[2]["seq"] == first[2]["seq"] + 1
        assert s.posts_failed == 1
        assert any("services[0].users: missing" in r.getMessage() for r in caplog.records)

    asyncio.run(main())


def test_server_error_is_retried_with_the_newest_report() -> None:
    async def main() -> None:
        report, _ = make_report()
        with portal_tcp() as (rec, url):
            rec.answers += [(503, {"error": "busy"}), (503, {"error": "busy"})]
            s = HeartbeatSender(url, report, period_s=60, retries=3, backoff_initial_s=0.01)
            s.start()
            await wait_until(lambda: s.posts_ok == 1)
            await s.aclose()
        # three attempts, each with a fresh report
        assert [b["seq"] for b in rec.bodies()] == [1, 2, 3]

    asyncio.run(main())


def test_a_failing_report_does_not_end_heartbeats(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="oarbank_agent.reporting.heartbeat")
    calls = {"n": 0}

    def report() -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("report bug")
        return {"node_id": "n1", "hostname": "h", "time": time.time(), "services": []}

    async def main() -> None:
        with portal_tcp() as (rec, url):
            s = HeartbeatSender(url, report, period_s=0.1)
            s.start()
            await wait_until(lambda: len(rec.posts) >= 1)
            await s.aclose()
        assert any("building the node report failed" in r.getMessage() for r in caplog.records)

    asyncio.run(main())


def test_nothing_is_posted_after_aclose() -> None:
    async def main() -> None:
        report, _ = make_report()
        with portal_tcp() as (rec, url):
            s = HeartbeatSender(url, report, period_s=0.05)
            s.start()
            await wait_until(lambda: len(rec.posts) >= 1)
            await s.aclose()
            n = len(rec.posts)
            s.notify_change()
            for _ in range(3):
                await asyncio.sleep(0)  # what the notice scheduled (a callback, a task) runs
            # Nothing is left on the loop that could post: this test's task is the only one.
            assert asyncio.all_tasks() == {asyncio.current_task()}, asyncio.all_tasks()
            assert len(rec.posts) == n

    asyncio.run(main())


@pytest.mark.parametrize("url", ["ftp://x", "unix:relative.sock",
                                 "http://", "127.0.0.1:8470", "http://127.0.0.1:notaport"])
def test_bad_portal_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="portal URL"):
        PortalURL(url)


def test_portal_url_forms() -> None:
    u = PortalURL("http://127.0.0.1:8470/portal/")
    assert (u.host, u.port, u.prefix, u.unix_path) == ("127.0.0.1", 8470, "/portal", None)
    assert PortalURL("unix:/run/p.sock").unix_path == "/run/p.sock"
    assert PortalURL("unix:///run/p.sock").unix_path == "/run/p.sock"
    h = PortalURL("https://portal.example")
    assert (h.tls, h.port, h.host_header, h.private) == (True, 443, "portal.example:443", True)
    assert PortalURL("http://10.1.2.3:8470").private is False  # a token would cross in clear


def test_refusals_are_logged_once_per_cause_and_kept_in_status(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="oarbank_agent.reporting.heartbeat")

    async def main() -> None:
        report, _ = make_report()
        with portal_tcp() as (rec, url):
            rec.answers += [(401, {"error": "heartbeat: the token is not one this portal "
                                            "issued"})] * 3
            rec.answers += [(200, {"ok": True, "applied": False, "reason": "a later one"})]
            s = HeartbeatSender(url, report, period_s=0.05, token="oarbank_abc")
            s.start()
            await wait_until(lambda: len(rec.posts) >= 5)
            await s.aclose()
        st = s.status()
        causes = {r["cause"]: r["count"] for r in st["refused"]}
        assert causes == {"HTTP 401: heartbeat: the token is not one this portal issued": 3,
                          "not applied: a later one": 1}
        assert all(b["heartbeat_s"] == 0.05 for b in rec.bodies())
        lines = [r.getMessage() for r in caplog.records if "refused this node" in r.getMessage()]
        assert len(lines) == 2, lines  # once per cause, not once per post

    asyncio.run(main())


def test_token_file_must_be_private(tmp_path: Path) -> None:
    from oarbank_agent.reporting.heartbeat import read_token_file

    f = tmp_path / "token"
    f.write_text("oarbank_secret\n")
    f.chmod(0o644)
    with pytest.raises(ValueError, match="mode 0644 lets the group or others read it"):
        read_token_file(str(f))
    f.chmod(0o600)
    assert read_token_file(str(f)) == "oarbank_secret"
    f.write_text("two words")
    with pytest.raises(ValueError, match="several words"):
        read_token_file(str(f))
    with pytest.raises(ValueError, match="cannot open"):
        read_token_file(str(tmp_path / "missing"))


def test_aclose_returns_while_posts_keep_finishing() -> None:
    """A cancel that lands as a post completes must not be lost (asyncio.wait_for before 3.12
    can drop it, leaving aclose() waiting forever: a hung agent shutdown)."""

    async def main() -> None:
        report, _ = make_report()
        with portal_tcp() as (rec, url):
            for i in range(40):
                s = HeartbeatSender(url, report, period_s=0.001, debounce_s=0.0)
                s.start()
                n = len(rec.posts)
                await wait_until(lambda n=n: len(rec.posts) > n)
                await asyncio.sleep((i % 7) * 0.001)
                closing = asyncio.ensure_future(s.aclose())
                done, _ = await asyncio.wait({closing}, timeout=3)
                assert done, f"aclose() hung (round {i})"
                await closing
                assert s._task is None

    asyncio.run(main())
