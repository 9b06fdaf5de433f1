"""A test runner: does what its payload says and records what it saw.

Records {"event": "start"|"end", "t", "attempt", "stage"} in <module data>/runs.jsonl.
Payload keys (all optional): env (report the exact environment), requests (n connections to
`echo`, each sends a line and reads the service pid), keep_open (leave those connections open
at exit), bad_op (send an unknown op on the raw connector), burst (n immediate connects, then
count successful connects over rate_window_s), sleep_s (sleep_below_attempt), ignore_term,
exit / exit_below_attempt / failure (exit with a code, writing failure.json unless failure is
false), pad_kb (that many KiB of padding in the result's payload), events (that many events
{"event": "step", "i"} to the --events file, when the agent passes one), events_pad_kb (each
event padded to that many KiB), alloc_mb (allocate and touch that many MiB, then record
"allocated": what an attempt's memory.max stops), wait_file (wait until <module data>/<that
name> exists: the test says when the attempt may end).

``doctor --json`` answers <module data>/doctor.json ({"answer": <printed as JSON>, "exit": n})
when it exists, else {"ok": true}.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def record(event: str, **kw: object) -> None:
    line = json.dumps({"event": event, "t": time.time(), "pid": os.getpid(),
                       "attempt": os.environ.get("OARBANK_ATTEMPT_ID"), **kw}) + "\n"
    # The workdir: the only place a runner may write (the sandbox); agent_helpers.read_jsonl
    # reads <module data>/runs.jsonl as every attempt's records.
    fd = os.open(Path(os.environ["OARBANK_WORKDIR"]) / "runs.jsonl",
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def write_json(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def initial_environ() -> dict[str, str]:
    # /proc/self/environ is what we were started with (Python itself may add LC_CTYPE).
    raw = Path("/proc/self/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if item)


def one_request(i: int, keep: list) -> int:
    from oarbank_sdk import service_endpoint as ep

    s = ep.connect("echo")
    s.sendall(f"hello {i}\n".encode())
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    if keep is not None:
        keep.append(s)
    else:
        s.close()
    return int(reply.split()[0])


def bad_op() -> dict:
    fd = int(os.environ["OARBANK_SERVICE_ECHO"].split(":")[1])
    s = socket.socket(fileno=os.dup(fd))
    try:
        s.sendall(b'{"op": "bogus", "pid": 1}\n')
        reply = b""
        while not reply.endswith(b"\n"):
            reply += s.recv(4096)
        return json.loads(reply)
    finally:
        s.close()


def burst(n: int, window_s: float) -> dict:
    from oarbank_sdk import service_endpoint as ep

    outcomes = []
    t0 = time.monotonic()
    for _ in range(n):
        try:
            ep.connect("echo").close()
            outcomes.append("ok")
        except ep.EndpointError as exc:
            outcomes.append(exc.code)
    burst_s = time.monotonic() - t0
    ok_after = 0
    limited_after = 0
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        try:
            ep.connect("echo").close()
            ok_after += 1
        except ep.EndpointError as exc:
            if exc.code != "rate_limited":
                raise
            limited_after += 1
            time.sleep(0.005)
    return {"outcomes": outcomes, "burst_s": burst_s, "ok_after": ok_after,
            "limited_after": limited_after}


def doctor() -> int:
    try:
        conf = json.loads((Path(os.environ["OARBANK_MODULE_DATA"]) / "doctor.json").read_text())
    except FileNotFoundError:
        conf = {"answer": {"runner_protocol": {"supported": [1]}, "health": "healthy",
                           "capabilities": [], "checks": [{"name": "python", "ok": True}]}}
    print(json.dumps(conf.get("answer")))
    return int(conf.get("exit", 0))


def emit_events(path: str, n: int, pad_kb: int) -> None:
    with open(path, "a") as f:
        for i in range(n):
            f.write(json.dumps({"event": "step", "i": i, "pad": "x" * (pad_kb << 10)}) + "\n")


def main() -> int:
    args = sys.argv[1:]
    if args[:2] == ["doctor", "--json"]:
        return doctor()
    assert args[0] == "run", args
    spec_path, workdir, out = (args[args.index(k) + 1] for k in ("--spec", "--workdir", "--out"))
    spec = json.loads(Path(spec_path).read_text())
    payload = spec["payload"]
    record("start", stage=spec["stage"], cwd=os.getcwd(), argv=args)
    if "--events" in args and payload.get("events"):
        emit_events(args[args.index("--events") + 1], int(payload["events"]),
                    int(payload.get("events_pad_kb", 0)))
    result: dict = {"spec": spec}
    if payload.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if payload.get("env"):
        result["env"] = initial_environ()
    if payload.get("bad_op"):
        result["bad_op"] = bad_op()
    if payload.get("burst"):
        result["burst"] = burst(int(payload["burst"]), float(payload.get("rate_window_s", 2.0)))
    if payload.get("requests"):
        keep: list | None = [] if payload.get("keep_open") else None
        with ThreadPoolExecutor(8) as pool:
            result["pids"] = list(pool.map(lambda i: one_request(i, keep),
                                           range(int(payload["requests"]))))
    if payload.get("wait_file"):
        record("waiting", file=payload["wait_file"])
        go = Path(os.environ["OARBANK_MODULE_DATA"]) / str(payload["wait_file"])
        while not go.exists():
            time.sleep(0.05)
    if payload.get("alloc_mb"):
        hog = bytearray(int(payload["alloc_mb"]) << 20)
        for i in range(0, len(hog), 4096):
            hog[i] = 1  # touched: resident, charged to the attempt's cgroup
        record("allocated", mb=int(payload["alloc_mb"]))
        del hog
    attempt_no = int(os.environ["OARBANK_ATTEMPT_ID"].rsplit(".", 1)[1])
    if attempt_no < int(payload.get("sleep_below_attempt", 1 << 30)):
        record("sleep")
        time.sleep(float(payload.get("sleep_s", 0)))
    code = payload.get("exit")
    if code is not None and attempt_no < int(payload.get("exit_below_attempt", 1 << 30)):
        if payload.get("failure", True):
            write_json(os.path.join(workdir, "failure.json"),
                       {"reason": f"told_to_exit_{code}", "detail": "the payload said so"})
        record("end", exit=code)
        return int(code)
    if payload.get("pad_kb"):
        result["pad"] = "x" * (int(payload["pad_kb"]) << 10)
    write_json(out, {"envelope": 1, "payload": result})
    record("end", exit=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
