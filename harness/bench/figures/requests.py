"""Figure 2: the request path, brokered (inside a real attempt) against loopback, per round
side by side: one attempt's runner, then one baseline client process, the order alternating."""

from __future__ import annotations

from typing import Any

from ..context import MODULE_ID, Bench
from ..stats import metric

TITLE = "2. request path"
MS = 1000.0


def run(b: Bench) -> dict[str, Any]:
    p = b.params
    agent = b.agent()
    addrs = b.baseline_addrs()
    samples: dict[str, list[float]] = {}
    rps: dict[str, list[float]] = {}

    def add(res: dict[str, Any]) -> None:
        for key, v in res.items():
            if isinstance(v, dict) and "latencies_s" in v:
                samples.setdefault(key, []).extend(v["latencies_s"])
                rps.setdefault(key, []).append(len(v["latencies_s"]) / v["wall_s"])

    payload = {"mode": "requests", "per_request": p.req_per_request,
               "keepalive": p.req_keepalive, "warmup": 2}
    client_args = {"mode": "requests", **{k: addrs[k] for k in ("tcp_nodelay", "tcp_naive",
                                                                "unix")},
                   "per_request": p.req_per_request, "keepalive": p.req_keepalive,
                   "naive_keepalive": p.req_naive_keepalive, "warmup": 2}
    for r in range(p.req_rounds):
        steps = [lambda: add(agent.run_jobs(MODULE_ID, "bench", [payload])[0]),
                 lambda: add(b.client_result(b.client(client_args)))]
        for step in (steps if r % 2 == 0 else steps[::-1]):
            step()

    def lat(key: str, base: str, name: str, targets: dict[str, str] | None = None) -> dict:
        return metric(samples[key], unit="ms", scale=MS, baseline=samples[base],
                      baseline_name=name, targets=targets)

    def thr(key: str, base: str, name: str) -> dict:
        return metric(rps[key], unit="req/s", baseline=rps[base], baseline_name=name,
                      with_p99=False)

    tcp_pr, tcp_ka = "loopback TCP per request", "loopback TCP keep-alive (TCP_NODELAY)"
    metrics = {
        # request() per call (it pools kept-alive connections) against a loopback TCP request
        # on a fresh connection each, as a client without a pool pays (issue 16).
        "brokered_per_request_latency": lat("brokered_per_request", "tcp_per_request", tcp_pr,
                                            {"ratio": "<= 1.0"}),
        "brokered_keepalive_latency": lat("brokered_keepalive", "tcp_keepalive", tcp_ka,
                                          {"ratio": "<= 1.0"}),
        "unix_per_request_latency": lat("unix_per_request", "tcp_per_request", tcp_pr),
        "unix_keepalive_latency": lat("unix_keepalive", "tcp_keepalive", tcp_ka),
        "naive_tcp_keepalive_latency": lat("tcp_naive_keepalive", "tcp_keepalive", tcp_ka),
        "brokered_per_request_rps": thr("brokered_per_request", "tcp_per_request", tcp_pr),
        "brokered_keepalive_rps": thr("brokered_keepalive", "tcp_keepalive", tcp_ka),
        "brokered_vs_unix_per_request_latency": lat("brokered_per_request", "unix_per_request",
                                                    "unix socket path per request"),
        "brokered_vs_unix_keepalive_latency": lat("brokered_keepalive", "unix_keepalive",
                                                  "unix socket path keep-alive"),
    }
    details = {k: {"median_ms": metric(v, unit="ms", scale=MS)["median"],
                   "p99_ms": metric(v, unit="ms", scale=MS)["p99"], "samples": len(v)}
               for k, v in samples.items()}
    return {"title": TITLE, "metrics": metrics, "details": details}
