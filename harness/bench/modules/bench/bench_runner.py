"""The bench module's runner: the measuring client, inside a real attempt.

``python -I bench_runner.py run --spec S --workdir W --out W/result.json`` (contract
section 4). The runner is the only process with a connector, so the brokered side of every
request-path figure is measured here, with ``bench_client``'s loops, and written to
``result.json``. Stages and payloads:

- ``bench`` ``{"mode": "requests", "per_request": n, "keepalive": n, "warmup": n}``:
  latencies of ``service_endpoint.request`` and of one ``HTTPConnection``;
- ``bench`` ``{"mode": "connect", "count": n, "go_file": f, "cpu_pids"?: {side: pid}}``:
  latencies of ``service_endpoint.connect`` once every attempt of the round is at the
  barrier; with ``cpu_pids``, the CPU time each side spent during the loop (``cpu_ns``: this
  runner's own, and each pid's from ``/proc/<pid>/task/*/schedstat``, all its threads);
- ``bench`` ``{"mode": "hold", "release_file": f}``: one connection held
  (a request answered on it) until ``release_file`` exists;
- ``readiness``, ``readiness_polled`` and ``trivial`` ``{}``: only the runner's start time.

Each result's payload carries ``runner_start`` (unix time of the first line of this file).
"""

from __future__ import annotations

import time

RUNNER_START = time.time()  # first: the readiness figure ends its clock here

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def write_json_atomically(path: str, obj: dict) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def measure(stage: str, payload: dict) -> dict:
    if stage in ("readiness", "readiness_polled", "trivial"):
        return {}
    sys.path.insert(0, HERE)  # -I leaves the script's folder off sys.path
    import bench_client as bc

    from oarbank_sdk import service_endpoint as ep

    mode = payload.get("mode")
    if mode == "requests":
        n, k, w = payload["per_request"], payload["keepalive"], payload.get("warmup", 2)

        def one() -> None:
            r = ep.request("bench", "POST", bc.PATH, bc.BODY)
            if r.status != 200:
                raise RuntimeError(f"POST {bc.PATH} answered {r.status}: {r.body[:200]!r}")

        per, per_wall = bc.per_request_loop(one, n, w)
        keep, keep_wall = bc.keepalive_loop(ep.HTTPConnection("bench"), k, w)
        return {"brokered_per_request": {"latencies_s": per, "wall_s": per_wall},
                "brokered_keepalive": {"latencies_s": keep, "wall_s": keep_wall}}
    if mode == "connect":
        ep.connect("bench").close()  # the connector is opened outside the timed loop
        # The marker goes in this attempt's workdir: the sandbox lets a runner write nowhere else.
        bc.barrier(os.getcwd(), READY, payload["go_file"])
        pids = payload.get("cpu_pids") or {}
        before = {side: _cpu_ns(pid) for side, pid in pids.items()}
        own = time.process_time_ns()
        lat, first, last = bc.connect_loop(lambda: ep.connect("bench"), payload["count"])
        cpu = {"job": time.process_time_ns() - own}
        for side, pid in pids.items():
            now = _cpu_ns(pid)
            cpu[side] = None if now is None or before[side] is None else now - before[side]
        return {"latencies_s": lat, "first": first, "last": last, "cpu_ns": cpu}
    if mode == "hold":
        conn = ep.HTTPConnection("bench")
        conn.request("POST", bc.PATH, body=json.dumps(bc.BODY), headers=bc.HEADERS)
        conn.getresponse().read()
        with open(READY, "w") as f:  # in the workdir (the runner's cwd)
            f.write(str(os.getpid()))
        deadline = time.monotonic() + float(payload.get("max_hold_s", 60))
        while not os.path.exists(payload["release_file"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        conn.close()
        return {}
    raise ValueError(f"unknown mode {mode!r}")


READY = "bench.ready"  # the marker an attempt leaves in its workdir once it is in place


def _cpu_ns(pid: int) -> int | None:
    """CPU time of every thread of ``pid`` so far (ns), or None where /proc cannot tell."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def main(argv: list[str]) -> int:
    if argv[:1] == ["doctor"]:
        print(json.dumps({"ok": True, "runner_start": RUNNER_START}))
        return 0
    import argparse

    parser = argparse.ArgumentParser(prog="bench_runner.py")
    parser.add_argument("cmd", choices=["run"])
    for flag in ("--spec", "--workdir", "--out"):
        parser.add_argument(flag, required=True)
    parser.add_argument("--events")
    args = vars(parser.parse_args(argv))
    args = {"--" + k: v for k, v in args.items()}
    with open(args["--spec"], encoding="utf-8") as f:
        spec = json.load(f)
    try:
        out = measure(spec["stage"], spec.get("payload") or {})
    except Exception as exc:  # the harness reads the reason in the job record
        write_json_atomically(os.path.join(args["--workdir"], "failure.json"),
                              {"reason": type(exc).__name__, "detail": str(exc)[:500],
                               "fault": "job"})
        print(f"bench_runner: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    out["runner_start"] = RUNNER_START
    write_json_atomically(args["--out"], {"envelope": 1, "payload": out})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
