"""The runner of agent/tests/test_web_agent.py's battery module: every client of
oarbank_sdk.web against the web_app.py service, inside a real attempt, in the sandbox.
Writes what it saw to result.json; the test judges it."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from oarbank_sdk import service_endpoint as ep
from oarbank_sdk import web

URL = "http://model"


def pool_of(c: httpx.Client):  # httpcore's pool inside web.HTTPTransport (a test may look)
    return c._transport._pool  # type: ignore[attr-defined]


def pool_sees_a_close(c: httpx.Client, pooled: int, timeout: float = 20) -> None:
    """uvicorn closes a connection whose app raised, after its 500 went out (with keep-alive:
    HTTP/1.1's race). A fixed sleep lost that race under CI's load; wait until the pool has
    dropped the connection or sees it closed, which is what the next request relies on."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conns = pool_of(c).connections
        if len(conns) < pooled or any(conn.has_expired() for conn in conns):
            return
        time.sleep(0.05)


def battery() -> dict:
    out: dict = {}
    with httpx.Client(transport=web.HTTPTransport("model"), base_url=URL, timeout=60) as c:
        with ThreadPoolExecutor(8) as pool:
            out["thread_pids"] = sorted(set(pool.map(lambda _: c.get("/info").json()["pid"],
                                                     range(40))))

        async def tasks() -> list[int]:
            async with httpx.AsyncClient(transport=web.AsyncHTTPTransport("model"),
                                         base_url=URL, timeout=60) as ac:
                rs = await asyncio.gather(*(ac.get("/info") for _ in range(30)))
                return sorted({r.json()["pid"] for r in rs})

        out["task_pids"] = asyncio.run(tasks())
        with web.session("model") as s, \
                s.get(f"{URL}/stream", params={"n": 3, "gap": 0.05}, stream=True, timeout=60) as r:
            out["events"] = [line.decode() for line in r.iter_lines() if line]

        chunk = os.urandom(1 << 20)
        out["digest"] = c.post("/digest", content=(chunk for _ in range(100))).json()
        out["digest_expected"] = {"length": 100 << 20,
                                  "sha256": hashlib.sha256(chunk * 100).hexdigest()}

        pooled = len(pool_of(c).connections)
        out["boom_status"] = c.get("/boom").status_code
        pool_sees_a_close(c, pooled)
        out["after_boom"] = c.get("/info").status_code

        sock = ep.connect("model", timeout=30)  # a client that vanishes mid-stream
        sock.sendall(b"GET /stream?n=1000&gap=0.05 HTTP/1.1\r\nHost: model\r\n\r\n")
        sock.settimeout(30)
        out["dropped_first_bytes"] = sock.recv(12).decode()
        sock.close()
        out["after_drop"] = c.get("/info").status_code

        # A restart in the middle of a keep-alive pool: the service dies, the agent restarts
        # it, the pool's idle connections are dead and the next requests take new ones.
        before = c.get("/info").json()["pid"]
        out["dying"] = c.post("/die").json()["dying"]
        # The app exits 0.2 s after that answer. Nothing here can see it go without a request,
        # and a request would use the pool under test: so a window of 1 s, five times that.
        time.sleep(1.0)
        errors, after, deadline = [], None, time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                after = c.get("/info").json()["pid"]
            except httpx.TransportError as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.5)
                continue
            if after != before:
                break
            time.sleep(0.2)
        out.update(pid_before=before, pid_after=after, restart_errors=errors)
    return out


def main(argv: list[str]) -> int:
    if argv[:1] == ["doctor"]:
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": [], "checks": []}))
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("cmd")
    p.add_argument("--spec")
    p.add_argument("--workdir")
    p.add_argument("--out")
    p.add_argument("--events")
    args = p.parse_args(argv)
    result = battery()
    with open(args.out + ".tmp", "w") as f:
        json.dump({"envelope": 1, "payload": result}, f)
    os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
