"""Shared fixtures: heartbeat documents, a real `oarbank-portal serve` process, an HTTP client
that speaks to it over loopback TCP or its unix socket, and the two stores (`store_url`: an
SQLite file, or a fresh database on this worker's own PostgreSQL server)."""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib: helpers by path

from pgcluster import PgCluster  # noqa: E402
from portal_helpers import MODULE_ID, auth, heartbeat, service_row  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "modelserver"
ARTIFACTS = REPO / ".artifacts"


@pytest.fixture
def make_row() -> Callable[..., dict[str, Any]]:
    return service_row


@pytest.fixture
def make_heartbeat() -> Callable[..., dict[str, Any]]:
    return heartbeat


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self._path)
        self.sock = s


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def request(base: str, method: str, path: str, body: Any = None, *,
            raw: bytes | None = None, headers: dict[str, str] | None = None,
            timeout: float = 10.0) -> Reply:
    """One request to ``base`` (``http://host:port`` or ``unix:/path``)."""
    conn: http.client.HTTPConnection
    if base.startswith("unix:"):
        conn = _UnixHTTPConnection(base[5:], timeout)
    else:
        host, port = base[len("http://"):].rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = dict(headers or {})
        if data is not None:
            hdrs.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


@pytest.fixture
def http_request() -> Callable[..., Reply]:
    return request


# -- stores ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_cluster(system_package: Callable[[str], None]) -> Iterator[PgCluster]:
    """This worker's PostgreSQL server (each xdist worker is its own process: its own server,
    in its own folder, on a unix socket only)."""
    system_package("postgresql")
    cluster = PgCluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store lives: run once with an SQLite file, once with a new PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "portal.db")
    cluster: PgCluster = request.getfixturevalue("pg_cluster")
    return cluster.create_database()


def issue_token(db: str | Path, node_id: str) -> str:
    """A node token, issued straight into the store (what `oarbank-portal token issue` does;
    in-process so a test posting for 200 nodes does not start 200 processes)."""
    from oarbank_ui.store.heartbeats import open_store

    store = open_store(str(db), min_size=1, max_size=1) if str(db).startswith(
        "postgresql") else open_store(db)
    try:
        return store.issue_token(node_id)[0]
    finally:
        store.close()


@dataclass
class PortalProc:
    url: str
    proc: subprocess.Popen[bytes]
    db: str | Path
    log: Path
    tokens: dict[str, str]

    def get(self, path: str, **kw: Any) -> Reply:
        return request(self.url, "GET", path, **kw)

    def token(self, node_id: str) -> str:
        if node_id not in self.tokens:
            self.tokens[node_id] = issue_token(self.db, node_id)
        return self.tokens[node_id]

    def post_heartbeat(self, doc: Any, *, token: str | None = None) -> Reply:
        """Post with the node's own token (issued on first use) unless ``token`` is given."""
        if token is None:
            token = self.token(doc["node_id"])
        return request(self.url, "POST", "/v1/heartbeat", doc, headers=auth(token))

    def services(self, **params: str) -> list[dict[str, Any]]:
        from urllib.parse import urlencode

        params.setdefault("module", MODULE_ID)
        r = self.get("/v1/queries/services?" + urlencode(params))
        assert r.status == 200, r.text
        return r.json()  # type: ignore[no-any-return]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    if proc.stdout:
        proc.stdout.close()


@pytest.fixture
def start_portal(tmp_path: Path) -> Iterator[Callable[..., PortalProc]]:
    """Start ``oarbank-portal serve`` (its own process group); stopped after the test."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*modules: Path, unix: Path | None = None, listen: str = "127.0.0.1:0",
              db: str | Path | None = None, refresh_s: float = 0.5,
              args: tuple[str, ...] = ()) -> PortalProc:
        db = db or tmp_path / "portal.db"
        log = tmp_path / f"portal-{len(procs)}.log"
        argv = [sys.executable, "-m", "oarbank_ui.cli", "serve", "--db", str(db),
                "--refresh-s", str(refresh_s)]
        for m in modules or (EXAMPLE,):
            argv += ["--module", str(m)]
        argv += ["--unix", str(unix)] if unix else ["--listen", listen]
        argv += list(args)
        with open(log, "wb") as errf:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errf,
                                    start_new_session=True)
        procs.append(proc)
        assert proc.stdout is not None
        deadline = time.monotonic() + 20
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise AssertionError(f"portal did not start: {log.read_text()}")
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 1)
                if not chunk:
                    raise AssertionError(f"portal exited: {log.read_text()}")
                line += chunk
        text = line.decode().strip()
        assert text.startswith("oarbank-portal: serving on "), text
        return PortalProc(text.rsplit(" ", 1)[1], proc, db, log, {})

    try:
        yield start
    finally:
        for p in procs:
            _stop(p)


# -- browser --------------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def chromium(system_package: Callable[[str], None]) -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (one per test module)."""
    from playwright.sync_api import sync_playwright

    system_package("chromium")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class BrowserPage:
    page: Any
    dialogs: list[str]
    console_errors: list[str]


@pytest.fixture
def browser_page(chromium: Any) -> Iterator[BrowserPage]:
    """A fresh page; records any dialog (none may open) and console errors."""
    ctx = chromium.new_context(viewport={"width": 1280, "height": 720})
    page = ctx.new_page()
    page.set_default_timeout(15_000)
    dialogs: list[str] = []
    errors: list[str] = []

    def on_dialog(d: Any) -> None:
        dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", on_dialog)
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        yield BrowserPage(page, dialogs, errors)
    finally:
        ctx.close()


def table_cells(page: Any, table_id: str = "services") -> list[list[str]]:
    """The rendered table's body cells as a person reads them."""
    rows = page.locator(f'[data-id="{table_id}"] tbody tr')
    return [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]


@pytest.fixture
def read_table() -> Callable[..., list[list[str]]]:
    return table_cells


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Callable[[Any, str], Path]:
    """Save a screenshot under .artifacts/ui-pages/ (git-ignored) and return its path."""

    def shot(page: Any, name: str) -> Path:
        out = ARTIFACTS / "ui-pages"
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        print(f"\nscreenshot: {path}")
        return path

    return shot
