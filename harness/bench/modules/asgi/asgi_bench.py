"""The ASGI figure's measuring program: one set of loops, run on both sides of the figure.

- ``run --spec S --workdir W --out O``: the runner of a real attempt (the module is
  examples/openai-compatible with this file as its runner; the figure builds it): the loops
  through ``httpx.Client(transport=oarbank_sdk.web.HTTPTransport("model"))``, every
  connection handed over by the agent.
- ``baseline-server SETTINGS``: the same app (the example's ``app.py``) under plain uvicorn on
  a loopback TCP port (127.0.0.1, port 0), with the options ``serve_asgi`` gives uvicorn
  (``http="auto"``, ``loop="auto"``, no access log); prints ``{"port": n}``, serves until
  stdin closes.
- ``baseline-client PORT PAYLOAD``: the same loops with ``httpx.Client()`` to
  ``http://127.0.0.1:PORT``; prints the result.

Payload ``{"connect": n, "per_request": n, "keepalive": n, "stream": n, "warmup": n}`` (an
attempt's connects stay under the agent's burst of 64: past it, 32 a second, refused beyond). Loops (each
request a ``POST /v1/chat/completions``, as an openai client sends it):

- connect: a bare connection opened and closed (``service_endpoint.connect``: a round trip to
  the agent, which hands the other end to the service; a TCP connect the server accepts);
- per request: ``Connection: close``, so each request takes a fresh connection (through the
  agent on one side, a TCP connect on the other);
- keep-alive: one pooled connection for all;
- time to first token: a streamed chat completion (``"stream": true``) on a kept-alive
  connection, timed to the first ``data:`` line that carries content.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = "/v1/chat/completions"
BODY = {"model": "stand-in-reverser", "messages": [{"role": "user", "content": "nothing listens"}]}
STREAM_BODY = {**BODY, "stream": True}


def loops(client: Any, payload: dict, connect: Any) -> dict:
    """The figure's loops on ``client``; ``connect()`` opens (and the loop closes) one bare
    connection the way the client's pool does."""
    warm = int(payload.get("warmup", 2))

    def post(headers: dict | None = None) -> None:
        r = client.post(PATH, json=BODY, headers=headers)
        if r.status_code != 200:
            raise RuntimeError(f"POST {PATH} answered {r.status_code}: {r.text[:200]}")

    def first_token() -> None:
        with client.stream("POST", PATH, json=STREAM_BODY) as r:
            lines = r.iter_lines()
            for line in lines:
                if line.startswith("data: {") and '"content"' in line:
                    break
            else:
                raise RuntimeError("the stream ended without a token")
            for _ in lines:  # drain it: the connection goes back to the pool
                pass

    def timed(fn: Any, n: int) -> dict:
        for _ in range(warm):
            fn()
        lat = []
        t_all = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            lat.append(time.perf_counter() - t0)
        return {"latencies_s": lat, "wall_s": time.perf_counter() - t_all}

    return {"connect": timed(lambda: connect().close(), payload["connect"]),
            "per_request": timed(lambda: post({"Connection": "close"}), payload["per_request"]),
            "keepalive": timed(post, payload["keepalive"]),
            "ttft": timed(first_token, payload["stream"])}


def _write(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def run(spec_path: str, workdir: str, out: str) -> int:
    import httpx

    from oarbank_sdk import service_endpoint as ep
    from oarbank_sdk.web import HTTPTransport

    with open(spec_path, encoding="utf-8") as f:
        payload = json.load(f).get("payload") or {}
    try:
        with httpx.Client(transport=HTTPTransport("model"), base_url="http://model",
                          timeout=60) as client:
            result = loops(client, payload, lambda: ep.connect("model", timeout=60))
    except Exception as exc:
        _write(os.path.join(workdir, "failure.json"),
               {"reason": type(exc).__name__, "detail": str(exc)[:500], "fault": "job"})
        print(f"asgi_bench: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    _write(out, {"envelope": 1, "payload": result})
    return 0


def baseline_server(settings: str) -> int:
    import socket
    import threading

    import uvicorn

    os.environ["OARBANK_SETTINGS_FILE"] = settings
    sys.path.insert(0, HERE)  # the example's app.py, copied beside this file
    from app import app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # loopback only
    config = uvicorn.Config(app, http="auto", loop="auto", access_log=False,
                            log_level="warning", lifespan="on")
    server = uvicorn.Server(config)

    def announce() -> None:
        while not server.started:
            time.sleep(0.01)
        print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
        sys.stdin.read()  # the bench closes our stdin: stop
        server.should_exit = True

    threading.Thread(target=announce, daemon=True).start()
    server.run(sockets=[sock])
    sock.close()
    return 0


def baseline_client(port: int, payload: dict) -> int:
    import socket

    import httpx

    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
        print(json.dumps(loops(client, payload,
                               lambda: socket.create_connection(("127.0.0.1", port), 60))))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["doctor"]:
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": [], "checks": []}))
        return 0
    if argv[:1] == ["baseline-server"]:
        return baseline_server(argv[1])
    if argv[:1] == ["baseline-client"]:
        return baseline_client(int(argv[1]), json.loads(argv[2]))
    import argparse

    parser = argparse.ArgumentParser(prog="asgi_bench.py")
    parser.add_argument("cmd", choices=["run"])
    for flag in ("--spec", "--workdir", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--events")
    args = parser.parse_args(argv)
    return run(args.spec, args.workdir, args.out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
