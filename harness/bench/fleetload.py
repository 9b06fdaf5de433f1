"""``--fleet``, part (b): claim throughput. A real ``oarbank-portal serve`` per store (SQLite
on one process, its default, then PostgreSQL on two and on a server this bench starts, as
``--portal`` does: ``WORKERS``), jobs submitted to it
over HTTP (batches of 10,000), then 1,000 nodes claiming over real HTTP on loopback,
each as the agent does: a long-polled claim (``wait_s`` 20) for what its ready service's
free tokens allow (``max_grants`` 4); each grant "runs" ``job_s`` (uniform), then its result
goes back and its token is free. The nodes are asyncio tasks in this process, one keep-alive
connection each (uvloop when installed); each starts within a mean job time of the first (a
fleet's nodes do not claim in one instant), and this process's garbage collector is held
for the run (its pauses would be counted as the portal's latency).

Each store three times, on a fresh database each time:
- ``carried`` and ``alone``, side by side, at the fleet's ``TARGET`` demand: job times 2.5-4.5
  s, so 1,000 nodes of 4 tokens ask for about 1,140 grants/s. Results ``carried`` by the next
  claim (contract 10.4 ``results``: what the agent does) against results posted ``alone``
  (``POST /v1/agent/result``, one request each: the protocol before claims carried them).
- ``capacity``: results carried, job times 1-3 s (about 2,000 grants/s asked): what the
  portal gives when the nodes ask more than it can.

Figures per run, over the window after the warm-up (two mean job times: every node claiming,
jobs ending at a running fleet's pace) until the run's end or the queue runs dry (work waits
throughout): grants per second, claims per second, claim latency (p50, p99, from the
request's write to its answer; and the p99 of each 2 s, to see it hold) of the claims answered
while work waited, the results accepted, and the jobs granted twice (a job id in two grants:
0, since no lease expires in the window) and the attempts the store holds for a job beyond
one. Targets, at the fleet's demand: >= 1,000 grants/s, claim p99 <= 100 ms, 0 granted twice.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .portal import NO_SERVER, PortalProcess, _arun, _cpu_s, _read_reply, store_db
from .stats import percentile

__all__ = ["RUNS", "run_claim_bench"]

# run -> (results carried by the next claim, the job times): at the fleet's demand, side by
# side with each result a request of its own, and carried at the nodes' most
RUNS = {"carried": (True, (2.5, 4.5)), "alone": (False, (2.5, 4.5)),
        "capacity": (True, (1.0, 3.0))}
# Portal processes per store: SQLite has one writer, so a second process only waits for its
# lock (measured: 1,132 grants/s on one, 877 on two, 895 on three); PostgreSQL takes several.
WORKERS = {"sqlite": 1, "postgresql": 2}
CARRY_MAX = 64  # the portal's MAX_CLAIM_RESULTS

MODULE = "dev.example.modelserver"
SLOTS = 4
BATCH = 10_000


def _claim_body(node: str) -> bytes:
    return json.dumps({
        "node_id": node, "wait_s": 20, "max_grants": SLOTS, "free_mem_gb": 0.5,
        "evictable_mem_gb": 0.0, "gpus": [],
        "modules": [{"module": MODULE, "stages": ["generate"], "services": [
            {"service": "model", "state": "ready", "pools": {"model": {"free": SLOTS,
                                                                         "total": SLOTS}},
             "load_s": 1.0, "job_s": 0.01, "mem_gb": 0.5}]}]}).encode()


def _result_doc(node: str, g: dict[str, Any]) -> dict[str, Any]:
    now = time.time()
    return {"node_id": node, "attempt_id": g["attempt_id"],
                       "generation": g["generation"],
                       "record": {"job_id": f"local-{g['attempt_id']}", "module": MODULE,
                                  "stage": "generate", "state": "succeeded", "attempts": 1,
                                  "exit_code": 0, "reason": None, "started_at": now,
                                  "finished_at": now},
            "result": {"envelope": 1, "payload": {"texts": []}}}


def _request(host: str, port: int, path: str, token: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            ).encode() + body


async def _submit(host: str, port: int, token: str, jobs: int) -> float:
    reader, writer = await asyncio.open_connection(host, port)
    t0 = time.perf_counter()
    try:
        for start in range(0, jobs, BATCH):
            n = min(BATCH, jobs - start)
            body = json.dumps({"jobs": [{"module": MODULE, "stage": "generate",
                                         "payload": {"prompts": [f"job {start + i}"]}}
                                        for i in range(n)]}).encode()
            writer.write(_request(host, port, "/v1/jobs", token, body))
            status, reply = await _read_reply(reader)
            if status != 201:
                raise RuntimeError(f"submit answered {status}: {reply[:300]!r}")
    finally:
        writer.close()
    return time.perf_counter() - t0


async def _nodes(host: str, port: int, tokens: list[tuple[str, str]], seconds: float,
                 job_s: tuple[float, float], warmup_s: float, carry: bool) -> dict[str, Any]:
    # (seconds: the whole run, its first warmup_s not measured)
    """Each node: ``SLOTS`` tokens; a claim for its free ones whenever it has some (one at a
    time, long-polled); each grant runs ``job_s`` (uniform), then its result is carried by
    the next claim (``carry``: its token is free at once, which makes that claim) or posted
    alone (the token free once the portal answered)."""
    import random

    rnd = random.Random(50)
    claims: list[tuple[float, float, int]] = []  # (answered at, latency, grants)
    granted: list[str] = []
    statuses: dict[str, int] = {}
    results = {"accepted": 0, "refused": 0}
    lost = [0]  # requests whose connection failed (no answer)
    t_start = time.perf_counter()
    deadline = t_start + seconds

    async def node(name: str, token: str) -> None:
        conn = [await asyncio.open_connection(host, port)]
        lock = asyncio.Lock()  # one keep-alive connection: claims and results take turns
        free = [SLOTS]
        freed = asyncio.Event()
        jobs: set[asyncio.Task[None]] = set()
        owed: list[dict[str, Any]] = []  # results for the next claim to carry

        async def post(path: str, body: bytes) -> tuple[int, bytes]:
            async with lock:
                try:
                    conn[0][1].write(_request(host, port, path, token, body))
                    return await _read_reply(conn[0][0])
                except (OSError, asyncio.IncompleteReadError):
                    lost[0] += 1
                    conn[0][1].transport.abort()
                    conn[0] = await asyncio.open_connection(host, port)
                    return 0, b""

        async def job(g: dict[str, Any]) -> None:
            await asyncio.sleep(rnd.uniform(*job_s))
            if carry:
                owed.append(_result_doc(name, g))
            else:
                status, _ = await post("/v1/agent/result",
                                       json.dumps(_result_doc(name, g)).encode())
                results["accepted" if status == 200 else "refused"] += 1
            free[0] += 1
            freed.set()

        try:
            # a fleet's nodes do not claim in one instant: each starts within a mean job time,
            # so that the jobs' ends are spread as a running fleet's are
            await asyncio.sleep(rnd.uniform(0.0, sum(job_s) / 2))
            while time.perf_counter() < deadline:
                if free[0] == 0:
                    freed.clear()
                    await freed.wait()
                    continue
                body = json.loads(_claim_body(name))
                body["max_grants"] = free[0]
                body["modules"][0]["services"][0]["pools"]["model"]["free"] = free[0]
                carried = owed[:CARRY_MAX]
                del owed[:CARRY_MAX]
                if carried:
                    body["results"] = carried
                sent = time.perf_counter()
                status, reply = await post("/v1/agent/claim", json.dumps(body).encode())
                took = time.perf_counter() - sent
                statuses[str(status)] = statuses.get(str(status), 0) + 1
                if status != 200:
                    owed[:0] = carried  # sent again with the next claim
                    await asyncio.sleep(1.0)
                    continue
                answer = json.loads(reply)
                for r in answer.get("results", []):
                    results["accepted" if r.get("status") == 200 else "refused"] += 1
                grants = answer["grants"]
                claims.append((time.perf_counter(), took, len(grants)))
                free[0] -= len(grants)
                for g in grants:
                    granted.append(g["job_id"])
                    t = asyncio.create_task(job(g))
                    jobs.add(t)
                    t.add_done_callback(jobs.discard)
            if jobs:
                await asyncio.gather(*jobs)
        finally:
            conn[0][1].close()

    await asyncio.gather(*(node(n, t) for n, t in tokens))
    lo, hi = t_start + warmup_s, deadline
    inside = [c for c in claims if lo <= c[0] <= hi and c[2] > 0]
    n_grants = sum(c[2] for c in inside)
    lat = [c[1] for c in inside]
    empty = sum(1 for c in claims if c[2] == 0)
    return {"window_s": round(hi - lo, 2), "claims_in_window": len(inside),
            "grants_in_window": n_grants, "grants": len(granted),
            "granted_twice": len(granted) - len(set(granted)),
            "grants_per_s": round(n_grants / (hi - lo), 1),
            "claims_per_s": round(len(inside) / (hi - lo), 1),
            "claim_p50_ms": round((percentile(lat, 50) or 0) * 1000, 1),
            "claim_p99_ms": round((percentile(lat, 99) or 0) * 1000, 1),
            "claim_max_ms": round(max(lat, default=0) * 1000, 1),
            "claims_answered_empty": empty, "statuses": statuses, "results": results,
            "no_answer": lost[0],
            "claim_p99_ms_per_2s": [round((percentile([c[1] for c in inside
                                                       if t <= c[0] < t + 2], 99) or 0) * 1000)
                                    for t in (lo + 2 * i for i in range(int((hi - lo) // 2)))]}


def _submitter(db: str) -> str:
    r = subprocess.run([sys.executable, "-m", "oarbank_ui.cli", "token", "issue", "--submitter",
                        "bench", "--db", db], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"token issue --submitter: {r.stderr.strip()}")
    return r.stdout.strip().splitlines()[-1].strip()


def _attempts_beyond_one(db: str, kind: str) -> int:
    q = ("SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) AS n FROM attempts GROUP BY"
         " job_id HAVING COUNT(*) > 1) x")
    if kind == "sqlite":
        with sqlite3.connect(db) as c:
            return int(c.execute(q).fetchone()[0])
    import psycopg

    with psycopg.connect(db) as c:
        row = c.execute(q).fetchone()
        return int(row[0]) if row else 0


def _one_store(kind: str, db: str, folder: Path, nodes: int, jobs: int, window_s: float,
               workers: int, job_s: tuple[float, float], carry: bool,
               db_pid: int | None = None) -> dict[str, Any]:
    from oarbank_ui.store.heartbeats import open_store

    store = open_store(db)
    tokens = store.issue_tokens([f"node-{i:04d}" for i in range(nodes)])
    store.close()
    sub = _submitter(db)
    warmup_s = sum(job_s)  # two mean job times
    # a node keeps one connection open: room for all of them (the default is 1,000)
    portal = PortalProcess(db, folder, workers, ("--max-connections", str(2 * nodes + 100)))
    try:
        submit_s = _arun(_submit(portal.host, portal.port, sub, jobs))
        print(f"bench fleet [{kind}, results {'carried' if carry else 'alone'}, jobs of "
              f"{job_s[0]:g}-{job_s[1]:g} s]: {jobs} jobs submitted in {submit_s:.1f} s; "
              f"{nodes} nodes claim for {warmup_s + window_s:g} s ...", file=sys.stderr,
              flush=True)
        cpu0 = (_cpu_s(portal.proc.pid), _cpu_s(db_pid), time.process_time())
        gc.collect()
        gc.freeze()  # what is here now is never scanned again; the run's garbage waits
        gc.disable()
        try:
            out = _arun(_nodes(portal.host, portal.port, list(tokens.items()),
                               warmup_s + window_s, job_s, warmup_s, carry))
        finally:
            gc.enable()
            gc.unfreeze()
        cpu1 = (_cpu_s(portal.proc.pid), _cpu_s(db_pid), time.process_time())
    finally:
        portal.stop()
    n = max(1, out["grants"])  # CPU over the whole run: its grants, and their results
    out["cpu_ms_per_grant"] = {"portal": round((cpu1[0] - cpu0[0]) * 1000 / n, 3),
                               "database_server": round((cpu1[1] - cpu0[1]) * 1000 / n, 3),
                               "nodes_client": round((cpu1[2] - cpu0[2]) * 1000 / n, 3)}
    out["attempts_beyond_one"] = _attempts_beyond_one(db, kind)
    out["jobs_submitted"] = jobs
    out["submit_s"] = round(submit_s, 2)
    out["job_s"] = list(job_s)
    out["asked_grants_per_s"] = round(nodes * SLOTS / (sum(job_s) / 2))
    return out


def run_claim_bench(*, nodes: int = 1000, jobs: int = 60_000, window_s: float = 15.0,
                    workers: dict[str, int] | None = None,
                    stores: tuple[str, ...] = ("sqlite", "postgresql")) -> dict[str, Any]:
    results: dict[str, Any] = {"nodes": nodes, "jobs": jobs, "window_s": window_s,
                               "slots": SLOTS, "portal_workers": workers or WORKERS,
                               "stores": {}}
    with tempfile.TemporaryDirectory(prefix="oarbank-fleet-claims-") as tmp:
        for kind in stores:
            runs: dict[str, Any] = {}
            results["stores"][kind] = runs
            for name, (carry, job_s) in RUNS.items():  # a fresh database and portal each
                folder = Path(tmp) / f"{kind}-{name}"
                folder.mkdir()
                try:
                    with store_db(kind, folder) as target:
                        if target is None:
                            results["stores"][kind] = {"error": NO_SERVER}
                            break
                        db, db_pid = target
                        runs[name] = _one_store(kind, db, folder, nodes, jobs, window_s,
                                                (workers or WORKERS)[kind], job_s, carry,
                                                db_pid=db_pid)
                except Exception as exc:  # noqa: BLE001 - in the table; the next run goes on
                    runs[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return results
