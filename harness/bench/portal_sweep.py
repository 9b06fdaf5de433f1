"""``nox -s bench -- --portal --portal-sweep``: the portal's capacity, per store (issue 33).

The same portal processes, nodes and load client as portal.py, in steady state: first every
node reports once (its whole snapshot; what a fleet's portal holds after one period), then:

- a sweep of offered rates (``--portal-rates``, each ``--portal-seconds`` long): the highest
  rate answered 200 in full with report p99 <= 100 ms (counted from when the report was due,
  as in portal.py) and 0 lost, and the CPU per report of the portal and of PostgreSQL;
- twice that rate: backpressure. Refused reports are answered 503 with Retry-After (the load
  client does not slow down: the worst case), and no answer may take longer than the
  portal's bound (``--ingest-bound-s``, 1 s); lost (no answer in 10 s) must stay 0;
- PostgreSQL only: the capacity of one portal process and of two processes on the same
  database (offered 3x the sweep's best rate, reports spread over both; capacity = answered
  200 per second), with the server's CPU per report, to say whether the database is the limit.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .portal import CONNECTIONS, NO_SERVER, PortalProcess, _arun, _cpu_s, _load, _read_reply, store_db

__all__ = ["run_portal_sweep"]

P99_TARGET_MS = 100.0


async def _warm(portals: list[PortalProcess], tokens: list[tuple[str, str]]) -> int:
    """Every node's first report, retried until stored (closed loop): steady state."""
    import json

    from .portal import SERVICES, _row

    todo = list(range(len(tokens)))
    stored = 0

    async def worker(w: int) -> None:
        nonlocal stored
        p = portals[w % len(portals)]
        reader, writer = await asyncio.open_connection(p.host, p.port)
        while todo:
            k = todo.pop()
            node, token = tokens[k]
            body = json.dumps({"node_id": node, "hostname": f"host-{node}",
                               "time": time.time(), "heartbeat_s": 10.0,
                               "services": [_row(s) for s in SERVICES]}).encode()
            writer.write((f"POST /v1/heartbeat HTTP/1.1\r\nHost: {p.host}:{p.port}\r\n"
                          f"Authorization: Bearer {token}\r\nContent-Type: application/json"
                          f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
            status, _ = await _read_reply(reader)
            if status == 200:
                stored += 1
            else:
                todo.append(k)
                await asyncio.sleep(0.2)
        writer.close()

    await asyncio.gather(*(worker(w) for w in range(CONNECTIONS)))
    return stored


async def _spread(portals: list[PortalProcess], tokens: list[tuple[str, str]], rate: float,
                  seconds: float) -> dict[str, Any]:
    """The load split evenly over ``portals`` (each its own share of the nodes)."""
    shares = [tokens[i::len(portals)] for i in range(len(portals))]
    runs = await asyncio.gather(*(_load(p.host, p.port, share, rate / len(portals), seconds)
                                  for p, share in zip(portals, shares, strict=True)))
    out: dict[str, Any] = {"offered": rate, "ok": sum(r["ok"] for r in runs),
                           "lost": sum(r["lost"] for r in runs),
                           "refused": sum(r["sent"] - r["ok"] - r["lost"] for r in runs),
                           "refused_retry_after": sum(r["refused_retry_after"] for r in runs),
                           "rate": round(sum(r["rate"] for r in runs), 1),
                           "p50_ms": max(r["p50_ms"] for r in runs),
                           "p99_ms": max(r["p99_ms"] for r in runs),
                           "answer_p99_ms": max(r["answer_p99_ms"] for r in runs),
                           "answer_max_ms": max(r["answer_max_ms"] for r in runs)}
    return out


def _measured(portals: list[PortalProcess], db_pid: int | None, tokens: list[tuple[str, str]],
              rate: float, seconds: float) -> dict[str, Any]:
    c0 = (sum(_cpu_s(p.proc.pid) for p in portals), _cpu_s(db_pid))
    r = _arun(_spread(portals, tokens, rate, seconds))
    c1 = (sum(_cpu_s(p.proc.pid) for p in portals), _cpu_s(db_pid))
    ok = max(1, r["ok"])
    r["cpu_ms_per_report"] = {"portal": round((c1[0] - c0[0]) * 1000 / ok, 3),
                              "database_server": round((c1[1] - c0[1]) * 1000 / ok, 3)}
    r["load_average"] = round(os.getloadavg()[0], 1)
    return r


def _store(kind: str, db: str, folder: Path, nodes: int, rates: list[float], seconds: float,
           workers: int, db_pid: int | None) -> dict[str, Any]:
    from oarbank_ui.store.heartbeats import open_store

    store = open_store(db)
    tokens = list(store.issue_tokens([f"node-{i:05d}" for i in range(nodes)]).items())
    store.close()
    out: dict[str, Any] = {"store": kind, "sweep": []}
    portal = PortalProcess(db, folder, workers)
    try:
        t0 = time.monotonic()
        out["warm"] = {"stored": _arun(_warm([portal], tokens)),
                       "seconds": round(time.monotonic() - t0, 1)}
        best = None
        for rate in rates:
            print(f"bench portal sweep [{kind}]: {rate:g} reports/s for {seconds:g} s ...",
                  file=sys.stderr, flush=True)
            r = _measured([portal], db_pid, tokens, rate, seconds)
            out["sweep"].append(r)
            held = r["ok"] == int(rate * seconds) and r["lost"] == 0 \
                and r["p99_ms"] <= P99_TARGET_MS
            r["held"] = held
            if held:
                best = r
        out["best"] = best
        twice = 2 * (best["offered"] if best else rates[0])
        print(f"bench portal sweep [{kind}]: backpressure at {twice:g} reports/s ...",
              file=sys.stderr, flush=True)
        out["twice"] = _measured([portal], db_pid, tokens, twice, seconds)
    finally:
        portal.stop()
    if kind == "postgresql":
        offered = 3 * (best["offered"] if best else rates[0])
        for n in (1, 2):
            print(f"bench portal sweep [{kind}]: {n} portal process(es), {offered:g} offered"
                  " ...", file=sys.stderr, flush=True)
            procs = [PortalProcess(db, folder, 1) for _ in range(n)]
            try:
                out[f"capacity_{n}_process"] = _measured(procs, db_pid, tokens, offered,
                                                         seconds)
            finally:
                for p in procs:
                    p.stop()
    return out


def run_portal_sweep(*, nodes: int, rates: list[float], seconds: float, workers: int,
                     stores: tuple[str, ...]) -> dict[str, Any]:
    results: dict[str, Any] = {"nodes": nodes, "rates": rates, "seconds": seconds,
                               "portal_workers": workers, "cpus": os.cpu_count(),
                               "load_average_at_start": os.getloadavg(), "stores": {}}
    with tempfile.TemporaryDirectory(prefix="oarbank-portal-sweep-") as tmp:
        folder = Path(tmp)
        for kind in stores:
            with store_db(kind, folder) as target:
                if target is None:
                    results["stores"][kind] = {"error": NO_SERVER}
                    continue
                db, db_pid = target
                results["stores"][kind] = _store(kind, db, folder, nodes, rates, seconds,
                                                 workers, db_pid)
    results["load_average_at_end"] = os.getloadavg()
    return results
