"""``nox -s bench -- --portal``: the portal under a fleet's heartbeats, SQLite and PostgreSQL
side by side, in one run.

What runs: a real ``oarbank-portal serve`` process per store (the PostgreSQL one on a server
this bench starts in a temp dir, fsync on, ``synchronous_commit=off`` like SQLite's
``synchronous=NORMAL`` in WAL: a crash may lose the last moments, never corrupt); 10,000
simulated nodes, each with its own token and 3 service rows, reporting every 10 s, i.e.
1,000 reports/s, for 60 s, over real HTTP on loopback.

The load client is asyncio in this process (not wrk or k6): each report must carry its own
node's token and a fresh body, and a load tool would need a script for that and is not
installed here. It is open-loop: report k is due at ``k / rate`` whatever the portal does,
and its latency counts from when it was due, so a portal that falls behind shows it in p99
(no coordinated omission). 64 keep-alive connections carry the reports; uvloop when installed
(the client shares the machine's cores with the portal: the less it takes, the fairer).

Figures per store: CPU milliseconds per report of the portal, of the PostgreSQL server and of
the load client (on a machine shared with other work these say more than the rate does: two
cores give 2,000 ms of CPU a second, so 1,000 reports/s need under 2 ms of all three together);
sustained rate (reports answered 200 per second), p50/p99 of a report,
refused (non-200) and lost (no answer within 10 s) reports, the portal's own accepted count
(from /metrics) against the client's, the ``services`` query over the 10,000 nodes (p50/p99,
module only: 200 rows; and one node), and the portal's peak RSS. Targets (goals, reported,
not asserted): 0 lost, p99 <= 100 ms, >= 1,000 reports/s, services p50 <= 20 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from oarbank_agent.reporting.alive import AliveState

from .config import MODELSERVER, REPO
from .stats import percentile

__all__ = ["run_portal_bench"]

MODULE = "dev.example.modelserver"
SERVICES = ("model", "tokenizer", "embedder")
CONNECTIONS = 64
SENDERS = ("full", "agent")  # every report whole; as the agent sends (still-alive, alive.py)
ANSWER_TIMEOUT_S = 10.0


def _pgcluster() -> Any:
    """The tests' throwaway PostgreSQL server (one implementation for tests and bench)."""
    path = REPO / "ui-pages" / "tests" / "pgcluster.py"
    spec = importlib.util.spec_from_file_location("oarbank_pgcluster", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


NO_SERVER = "no PostgreSQL server (apt-get install postgresql)"


@contextlib.contextmanager
def store_db(kind: str, folder: Path) -> Iterator[tuple[str, int | None] | None]:
    """The database a bench's portal serves from, as ``(db, db_pid)``: for ``sqlite`` a file in
    ``folder`` (no server), for ``postgresql`` a throwaway server (the tests' ``PgCluster``),
    stopped on leaving; ``None`` where this machine has no PostgreSQL server."""
    if kind == "sqlite":
        yield str(folder / "portal.db"), None
        return
    with pg_cluster() as cluster:
        yield (None if cluster is None else
               (cluster.create_database("bench"), cluster.proc.pid))


@contextlib.contextmanager
def pg_cluster() -> Iterator[Any]:
    """A throwaway PostgreSQL server (the tests' ``PgCluster``: ``create_database``,
    ``stop_server``, ``start_server``), stopped and deleted on leaving; ``None`` where this
    machine has none."""
    pg = _pgcluster()
    if pg.server_bindir() is None:
        yield None
        return
    cluster = pg.PgCluster(durable=True, extra=["-c", "synchronous_commit=off"])
    try:
        yield cluster
    finally:
        cluster.stop()


def _row(service: str) -> dict[str, Any]:
    return {"module": MODULE, "service": service, "health": "healthy", "running": True,
            "ready": True, "accepting": True, "error": None, "held": None, "disabled": False,
            "withdrawn": False, "gpu_api_missing": False, "lifecycle": "on_demand",
            "users": 1, "endpoint": True}


class PortalProcess:
    def __init__(self, db: str, folder: Path, workers: int,
                 serve_args: tuple[str, ...] = (), listen: str = "127.0.0.1:0") -> None:
        argv = [sys.executable, "-m", "oarbank_ui.cli", "serve", "--db", db, "--module",
                str(MODELSERVER), "--listen", listen, "--pool-size", "8",
                "--workers", str(workers), *serve_args]
        # appended: a portal started again (the faults part) keeps its predecessor's log
        self.log = open(folder / "portal.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        assert self.proc.stdout is not None
        line = b""
        deadline = time.monotonic() + 60
        while not line.endswith(b"\n"):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"portal did not start: {(folder / 'portal.log').read_text()}")
            if select.select([self.proc.stdout], [], [], 1)[0]:
                line += os.read(self.proc.stdout.fileno(), 1)
        m = re.search(rb"serving on http://([\d.]+):(\d+)", line)
        assert m, line
        self.host, self.port = m.group(1).decode(), int(m.group(2))
        self.ps = psutil.Process(self.proc.pid)  # the parent, and its workers below
        self.peak_rss = 0
        self._sampling = True
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while self._sampling:
            with contextlib.suppress(psutil.Error):
                rss = sum(p.memory_info().rss for p in [self.ps, *self.ps.children()])
                self.peak_rss = max(self.peak_rss, rss)
            time.sleep(0.5)

    def stop(self) -> None:
        self._sampling = False
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()

    def kill(self) -> None:
        """-9 to the portal and its workers at once, as a crash (the faults part)."""
        self._sampling = False
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.stop()


async def _read_reply(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"(?i)content-length:\s*(\d+)", head)
    body = await reader.readexactly(int(m.group(1))) if m else b""
    return status, body


async def _load(host: str, port: int, tokens: list[tuple[str, str]], rate: float,
                seconds: float, senders: str = "full") -> dict[str, Any]:
    """``senders``: "full", every report the node's whole snapshot (the worst case); "agent",
    what the agent sends (its own AliveState: a still-alive while nothing is new, the whole
    snapshot every sixth post and after any refusal)."""
    states: dict[str, AliveState] | None = {} if senders == "agent" else None
    short = 0
    queue: asyncio.Queue[tuple[float, int] | None] = asyncio.Queue()
    latencies: list[float] = []
    answers: list[float] = []  # from the request's write to its answer (the portal's part)
    statuses: dict[str, int] = {}
    retry_after = 0
    not_applied = 0
    lost = 0
    host_header = f"{host}:{port}"

    async def worker() -> None:
        nonlocal not_applied, lost, retry_after, short
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        while (item := await queue.get()) is not None:
            due, k = item
            node, token = tokens[k % len(tokens)]
            doc = {"node_id": node, "hostname": f"host-{node}", "time": time.time(),
                   "heartbeat_s": len(tokens) / rate, "services": [_row(s) for s in SERVICES]}
            state = None if states is None else states.setdefault(node, AliveState())
            body = json.dumps(doc if state is None else state.body(doc)).encode()
            short += state is not None and state.last_was_short
            req = (f"POST /v1/heartbeat HTTP/1.1\r\nHost: {host_header}\r\n"
                   f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            try:
                if conn is None:
                    conn = await asyncio.open_connection(host, port)
                sent = time.perf_counter()
                conn[1].write(req)
                status, reply = await asyncio.wait_for(_read_reply(conn[0]), ANSWER_TIMEOUT_S)
                answers.append(time.perf_counter() - sent)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError):
                lost += 1
                if state is not None:
                    state.forget()
                if conn is not None:
                    conn[1].transport.abort()
                conn = None
                continue
            latencies.append(time.perf_counter() - due)
            if state is not None:  # as the agent does: what it holds now, or start over
                state.answered(json.loads(reply)) if status == 200 else state.forget()
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if status == 200 and b'"applied": false' in reply:
                not_applied += 1
            if status in (429, 503) and b"again after" in reply:
                retry_after += 1  # the portal's backpressure answer (with its Retry-After)
        if conn is not None:
            conn[1].close()

    workers = [asyncio.create_task(worker()) for _ in range(CONNECTIONS)]
    total = int(rate * seconds)
    start = time.perf_counter() + 0.2
    k = 0
    while k < total:
        now = time.perf_counter()
        while k < total and start + k / rate <= now:
            queue.put_nowait((start + k / rate, k))
            k += 1
        await asyncio.sleep(0.001)
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    elapsed = time.perf_counter() - start
    ok = statuses.get("200", 0)
    return {"sent": total, "ok": ok, "statuses": statuses, "lost": lost,
            "not_applied": not_applied, "elapsed_s": round(elapsed, 2),
            "rate": round(ok / elapsed, 1),
            "p50_ms": round((percentile(latencies, 50) or 0) * 1000, 2),
            "p99_ms": round((percentile(latencies, 99) or 0) * 1000, 2),
            "max_ms": round(max(latencies, default=0) * 1000, 2),
            "answer_p99_ms": round((percentile(answers, 99) or 0) * 1000, 2),
            "answer_max_ms": round(max(answers, default=0) * 1000, 2),
            "refused_retry_after": retry_after, "senders": senders,
            "still_alive_share": round(short / max(1, total), 3)}


async def _queries(host: str, port: int, path: str, n: int) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection(host, port)
    times = []
    rows = 0
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            status, body = await _read_reply(reader)
            times.append(time.perf_counter() - t0)
            assert status == 200, body[:200]
            rows = len(json.loads(body))
    finally:
        writer.close()
    return {"rows": rows, "p50_ms": round((percentile(times, 50) or 0) * 1000, 2),
            "p99_ms": round((percentile(times, 99) or 0) * 1000, 2)}


def _metrics(host: str, port: int, *names: str) -> dict[str, float]:
    """The portal's own figures (unlabelled ones), -1 for one it does not show."""
    import urllib.request

    req = urllib.request.Request(f"http://{host}:{port}/metrics")
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - loopback
        text = r.read().decode()
    found = {name: -1.0 for name in names}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in found:
            found[name] = float(value)
    return found


def _cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) of a process and its descendants so far."""
    if pid is None:
        return 0.0
    try:
        root = psutil.Process(pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total
    except psutil.Error:
        return 0.0


def _arun(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def _measured_load(portal: PortalProcess, tokens: list[tuple[str, str]], rate: float,
                   seconds: float, senders: str, db_pid: int | None) -> dict[str, Any]:
    # CPU per report: what the figures mean on a machine shared with other work (the
    # rate and latencies depend on what else runs; CPU seconds per report much less)
    cpu0 = (_cpu_s(portal.proc.pid), _cpu_s(db_pid), time.process_time())
    load = _arun(_load(portal.host, portal.port, tokens, rate, seconds, senders))
    cpu1 = (_cpu_s(portal.proc.pid), _cpu_s(db_pid), time.process_time())
    ok = max(1, load["ok"])
    load["cpu_ms_per_report"] = {
        "portal": round((cpu1[0] - cpu0[0]) * 1000 / ok, 3),
        "database_server": round((cpu1[1] - cpu0[1]) * 1000 / ok, 3),
        "load_client": round((cpu1[2] - cpu0[2]) * 1000 / ok, 3)}
    load["cpu_ms_per_report"]["all_but_client"] = round(
        load["cpu_ms_per_report"]["portal"] + load["cpu_ms_per_report"]["database_server"], 3)
    return load


def _one_store(kind: str, db: str, folder: Path, nodes: int, rate: float,
               seconds: float, workers: int, db_pid: int | None = None,
               serve_args: tuple[str, ...] = ()) -> dict[str, Any]:
    from oarbank_ui.store.heartbeats import open_store

    store = open_store(db)
    t0 = time.perf_counter()
    tokens = store.issue_tokens([f"node-{i:05d}" for i in range(nodes)])
    issued_s = time.perf_counter() - t0
    store.close()
    portal = PortalProcess(db, folder, workers, serve_args)
    try:
        loads = {}
        for senders in SENDERS:  # the worst case first, then what a fleet of agents sends
            print(f"bench portal [{kind}]: {nodes} nodes, {rate:g} reports/s for {seconds:g} s,"
                  f" {senders} reports ...", file=sys.stderr, flush=True)
            loads[senders] = _measured_load(portal, list(tokens.items()), rate, seconds,
                                            senders, db_pid)
        m = _metrics(portal.host, portal.port, "oarbank_portal_reports_accepted_total",
                     "oarbank_portal_ingest_batches_total",
                     "oarbank_portal_ingest_batched_reports_total")
        accepted = m["oarbank_portal_reports_accepted_total"]
        batches = m["oarbank_portal_ingest_batches_total"]
        per_commit = (round(m["oarbank_portal_ingest_batched_reports_total"] / batches, 2)
                      if batches > 0 else None)
        q_all = _arun(_queries(portal.host, portal.port,
                                     f"/v1/queries/services?module={MODULE}", 200))
        q_one = _arun(_queries(portal.host, portal.port,
                                     f"/v1/queries/services?module={MODULE}&node_id=node-05000",
                                     200))
        rss = portal.peak_rss
    finally:
        portal.stop()
    return {"store": kind, "tokens_issued_s": round(issued_s, 2), "load": loads["full"],
            "load_agent": loads["agent"], "portal_accepted": accepted,
            "reports_per_commit": per_commit,
            "answered_200": sum(v["ok"] for v in loads.values()),
            "services_200_rows": q_all, "services_one_node": q_one,
            "portal_peak_rss_mb": round(rss / 2**20, 1)}


def _table(results: dict[str, Any]) -> str:
    s, p = results["stores"].get("sqlite", {}), results["stores"].get("postgresql", {})

    def get(d: dict[str, Any], *path: str) -> Any:
        for k in path:
            if not isinstance(d, dict) or k not in d:
                return "-"
            d = d[k]
        return d

    def ratio(a: Any, b: Any) -> str:
        return f"{b / a:.2f}" if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and a else "-"

    rows = [
        ("**every report whole**", (), ""),
        ("reports sent", ("load", "sent"), ""),
        ("answered 200", ("load", "ok"), ""),
        ("sustained rate (reports/s)", ("load", "rate"), ">= 1000"),
        ("report p50 (ms)", ("load", "p50_ms"), ""),
        ("report p99 (ms)", ("load", "p99_ms"), "<= 100"),
        ("report max (ms)", ("load", "max_ms"), ""),
        ("refused (non-200)", ("load", "statuses"), "0"),
        ("lost (no answer)", ("load", "lost"), "0"),
        ("not applied", ("load", "not_applied"), "0"),
        ("portal's accepted count, both runs", ("portal_accepted",), "= answered 200"),
        ("answered 200, both runs", ("answered_200",), ""),
        ("reports a transaction (group commit), both runs", ("reports_per_commit",), ""),
        ("portal CPU per report (ms)", ("load", "cpu_ms_per_report", "portal"), ""),
        ("PostgreSQL server CPU per report (ms)",
         ("load", "cpu_ms_per_report", "database_server"), ""),
        ("load client CPU per report (ms)", ("load", "cpu_ms_per_report", "load_client"), ""),
        ("portal + PostgreSQL CPU per report (ms)",
         ("load", "cpu_ms_per_report", "all_but_client"), "<= 0.5"),
        ("**as agents send (still-alive while nothing is new, whole every 6th)**", (), ""),
        ("share sent as still-alive", ("load_agent", "still_alive_share"), ""),
        ("sustained rate (reports/s)", ("load_agent", "rate"), ">= 1000"),
        ("report p99 (ms)", ("load_agent", "p99_ms"), "<= 100"),
        ("refused (non-200)", ("load_agent", "statuses"), "0"),
        ("lost (no answer)", ("load_agent", "lost"), "0"),
        ("portal CPU per report (ms)", ("load_agent", "cpu_ms_per_report", "portal"), ""),
        ("PostgreSQL server CPU per report (ms)",
         ("load_agent", "cpu_ms_per_report", "database_server"), ""),
        ("portal + PostgreSQL CPU per report (ms)",
         ("load_agent", "cpu_ms_per_report", "all_but_client"), "<= 0.5"),
        ("**queries and footprint**", (), ""),
        ("services, 200 rows: p50 (ms)", ("services_200_rows", "p50_ms"), "<= 20"),
        ("services, 200 rows: p99 (ms)", ("services_200_rows", "p99_ms"), ""),
        ("services, one node: p50 (ms)", ("services_one_node", "p50_ms"), ""),
        ("portal peak RSS, all workers (MiB)", ("portal_peak_rss_mb",), ""),
        ("tokens issued, all nodes (s)", ("tokens_issued_s",), ""),
    ]
    out = ["| figure | SQLite | PostgreSQL | PostgreSQL / SQLite | target |",
           "|---|---|---|---|---|"]
    for name, path, target in rows:
        if not path:  # a heading
            out.append(f"| {name} | | | | |")
            continue
        a, b = get(s, *path), get(p, *path)
        if path[1:] == ("statuses",):
            a = sum(v for k, v in a.items() if k != "200") if isinstance(a, dict) else a
            b = sum(v for k, v in b.items() if k != "200") if isinstance(b, dict) else b
        out.append(f"| {name} | {a} | {b} | {ratio(a, b)} | {target} |")
    return "\n".join(out)


def run_portal_bench(*, nodes: int = 10_000, period_s: float = 10.0, seconds: float = 60.0,
                     stores: tuple[str, ...] = ("sqlite", "postgresql"), workers: int = 2,
                     serve_args: tuple[str, ...] = (), out: Path | None = None
                     ) -> dict[str, Any]:
    """``serve_args``: more of the portal's own options (``oarbank-portal serve``), to measure
    one setting against another side by side (e.g. ``--ingest-linger-ms 2``)."""
    rate = nodes / period_s
    results: dict[str, Any] = {
        "started_at": time.time(), "nodes": nodes, "period_s": period_s, "seconds": seconds,
        "rate_target": rate, "connections": CONNECTIONS, "cpus": os.cpu_count(),
        "portal_workers": workers, "portal_serve_args": list(serve_args),
        "load_average_at_start": os.getloadavg(),
        "client": "asyncio, open loop, in the bench process", "stores": {}}
    with tempfile.TemporaryDirectory(prefix="oarbank-portal-bench-") as tmp:
        folder = Path(tmp)
        for kind in stores:
            with store_db(kind, folder) as target:
                if target is None:
                    results["stores"][kind] = {"error": NO_SERVER}
                    continue
                db, db_pid = target
                results["stores"][kind] = _one_store(kind, db, folder, nodes, rate, seconds,
                                                     workers, db_pid=db_pid,
                                                     serve_args=serve_args)
    results["load_average_at_end"] = os.getloadavg()
    results["table"] = _table(results)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
    return results
