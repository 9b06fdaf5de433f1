"""Figure 7: the ASGI path. examples/openai-compatible's FastAPI app served by
``oarbank_sdk.web.serve_asgi`` behind a real agent, measured from inside an attempt with httpx
on ``oarbank_sdk.web.HTTPTransport``, against the same app under plain uvicorn on loopback TCP
measured by the same loops (``modules/asgi/asgi_bench.py``), per round side by side, the order
alternating: a bare connect, a request per connection, requests over one kept-alive connection, and a
streamed chat completion's time to its first token."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..agentproc import Agent
from ..config import REPO
from ..context import Bench
from ..stats import metric

TITLE = "7. ASGI path (serve_asgi + httpx)"
MS = 1000.0
EXAMPLE = REPO / "examples" / "openai-compatible"
BENCH = Path(__file__).resolve().parents[1] / "modules" / "asgi" / "asgi_bench.py"
MODULE_ID = "dev.example.openai-compatible"
SETTINGS = {"load_s": 0.1, "token_s": 0.0, "slots": 4}


def bundle(tmp: Path) -> Path:
    """The example with asgi_bench.py as its runner (the service, app.py included, as is)."""
    dst = tmp / "asgi-module" / "openai-compatible"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(BENCH, dst / BENCH.name)
    manifest = dst / "oarbank-module.toml"
    text = manifest.read_text()
    runner = 'exec = ["python", "-I", "{bundle}/model_runner.py"]'
    if runner not in text:
        raise RuntimeError(f"{EXAMPLE}/oarbank-module.toml: its [runner] exec is not {runner}")
    manifest.write_text(text.replace(runner, f'exec = ["python", "-I", "{{bundle}}/{BENCH.name}"]'))
    return dst


def run(b: Bench) -> dict[str, Any]:
    p = b.params
    mod = bundle(b.tmp)
    settings_file = b.tmp / "asgi-baseline-settings.json"
    settings_file.write_text(json.dumps(SETTINGS))
    payload = {"connect": p.asgi_connect, "per_request": p.asgi_per_request, "keepalive": p.asgi_keepalive,
               "stream": p.asgi_stream, "warmup": 3}
    samples: dict[str, list[float]] = {}
    rps: dict[str, list[float]] = {}

    def add(side: str, res: dict[str, Any]) -> None:
        for loop, v in res.items():
            samples.setdefault(f"{side}_{loop}", []).extend(v["latencies_s"])
            rps.setdefault(f"{side}_{loop}", []).append(len(v["latencies_s"]) / v["wall_s"])

    agent = Agent(b.tmp / "asgi-state", [mod], {"openai-compatible": SETTINGS})
    server = subprocess.Popen([sys.executable, "-I", str(mod / BENCH.name), "baseline-server",
                               str(settings_file)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line:
            raise RuntimeError("the uvicorn baseline server did not start")
        port = json.loads(line)["port"]

        def brokered() -> None:
            add("asgi", agent.run_jobs(MODULE_ID, "chat", [payload])[0])

        def tcp() -> None:
            out = subprocess.run([sys.executable, "-I", str(mod / BENCH.name), "baseline-client",
                                  str(port), json.dumps(payload)], capture_output=True,
                                 text=True, timeout=300, stdin=subprocess.DEVNULL)
            if out.returncode != 0:
                raise RuntimeError(f"the baseline client exited {out.returncode}: "
                                   f"{out.stderr[-500:]}")
            add("tcp", json.loads(out.stdout))

        for r in range(p.asgi_rounds):
            for step in ((brokered, tcp) if r % 2 == 0 else (tcp, brokered)):
                step()
    finally:
        agent.stop()
        assert server.stdin is not None
        server.stdin.close()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()

    def lat(loop: str, name: str) -> dict:
        return metric(samples[f"asgi_{loop}"], unit="ms", scale=MS,
                      baseline=samples[f"tcp_{loop}"], baseline_name=name,
                      targets={"ratio": "<= 1.0"})

    def thr(loop: str, name: str) -> dict:
        return metric(rps[f"asgi_{loop}"], unit="req/s", baseline=rps[f"tcp_{loop}"],
                      baseline_name=name, with_p99=False)

    pr, ka = "uvicorn on loopback TCP, a connection each", "uvicorn on loopback TCP, keep-alive"
    st = "uvicorn on loopback TCP, streamed"
    metrics = {
        "asgi_connect_latency": metric(samples["asgi_connect"], unit="ms", scale=MS,
                                       baseline=samples["tcp_connect"],
                                       baseline_name="uvicorn on loopback TCP, a bare connect"),
        "asgi_per_request_latency": lat("per_request", pr),
        "asgi_keepalive_latency": lat("keepalive", ka),
        "asgi_time_to_first_token": lat("ttft", st),
        "asgi_per_request_rps": thr("per_request", pr),
        "asgi_keepalive_rps": thr("keepalive", ka),
    }
    details = {k: {"median_ms": metric(v, unit="ms", scale=MS)["median"],
                   "p99_ms": metric(v, unit="ms", scale=MS)["p99"], "samples": len(v)}
               for k, v in samples.items()}
    return {"title": TITLE, "metrics": metrics, "details": details}
