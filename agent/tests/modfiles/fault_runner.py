"""A test runner for fault tests: uses the `echo` service through the SDK while it fails.

Payload:
- mode "persistent": one connection, a request on it every 20 ms for up to max_s; if the
  connection breaks: failure.json (transient) and exit 75. Later attempts (or once the file
  named by stop_file exists) succeed at once.
- mode "fresh": a new connection per request for up to max_s, each outcome recorded with how
  long the connect took; ends once a service pid other than the first has answered.
- mode "hostile": sends the payload's base64 chunks raw on the connector, half-closes, reads
  every reply line until EOF, then (if ``then_connect``) nothing more: the attempt must still
  succeed and report the replies.
  ``attach``: n descriptors ride along with the first chunk (the agent must close them).
- mode "fds": reports the descriptors it was started with (fd -> what it names), then makes
  one request.
- mode "escape": a child leaves the runner's process group (setsid) keeping the connector,
  waits for the runner to be gone and its connector to be closed (15 s at most), then tries
  to connect and writes what happened to <module data>/escape-<attempt>.json. The runner
  itself exits 0 at once.
Result payload: {"outcomes": [...], "pids": [...], ...}.
"""

from __future__ import annotations

import base64
import json
import os
import select
import socket
import sys
import time
from pathlib import Path

from oarbank_sdk import service_endpoint as ep


def write_json(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def ask(s: socket.socket) -> int:
    s.sendall(b"ping\n")
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("the connection closed mid-request")
        reply += chunk
    return int(reply.split()[0])


def persistent(payload: dict, attempt: int, workdir: str) -> dict:
    s = ep.connect("echo")
    pids = [ask(s)]
    if attempt > 1:
        return {"pids": pids}
    stop = payload.get("stop_file")
    end = time.monotonic() + float(payload.get("max_s", 20))
    try:
        while time.monotonic() < end and not (stop and os.path.exists(stop)):
            pids.append(ask(s))
            time.sleep(0.02)
    except (OSError, ValueError) as exc:
        write_json(os.path.join(workdir, "failure.json"),
                   {"reason": "service_lost", "detail": f"{exc} after {len(pids)} requests",
                    "fault": "transient"})
        sys.exit(75)
    return {"pids": pids}


def fresh(payload: dict) -> dict:
    outcomes: list[dict] = []
    first = None
    end = time.monotonic() + float(payload.get("max_s", 20))
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            s = ep.connect("echo")
        except ep.EndpointError as exc:
            outcomes.append({"error": exc.code, "dt": time.monotonic() - t0})
            continue
        dt = time.monotonic() - t0
        try:
            pid = ask(s)
        except (OSError, ValueError) as exc:
            outcomes.append({"lost": str(exc), "dt": dt})
            continue
        finally:
            s.close()
        outcomes.append({"pid": pid, "dt": dt})
        first = first or pid
        if pid != first:
            break
        time.sleep(0.02)
    return {"outcomes": outcomes}


REPLIES_KEPT = 500


def hostile(payload: dict) -> dict:
    fd = int(os.environ["OARBANK_SERVICE_ECHO"].split(":")[1])
    s = socket.socket(fileno=fd)
    s.settimeout(float(payload.get("read_timeout_s", 10)))
    sent_ok = True
    try:
        for i, chunk in enumerate(payload["chunks"]):
            data = base64.b64decode(chunk)
            if i == 0 and payload.get("attach"):
                extra = [os.open("/dev/null", os.O_RDONLY) for _ in range(int(payload["attach"]))]
                sent = socket.send_fds(s, [data], extra)
                for fd in extra:
                    os.close(fd)
                s.sendall(data[sent:])
                continue
            s.sendall(data)
        s.shutdown(socket.SHUT_WR)
    except OSError:
        sent_ok = False  # the agent may end a connector that sent an over-long line
    data = b""
    error = None
    try:
        while True:
            part = s.recv(65536)
            if not part:
                break
            data += part
    except OSError as exc:
        # A connector the agent ended (this job stopped reading) still delivers what the agent
        # wrote before: the kernel hands over queued data before the reset. Keep those replies.
        error = str(exc)
    complete = data[: data.rfind(b"\n") + 1]  # a reset can cut the last line
    replies = [json.loads(line) for line in complete.splitlines() if line.strip()]
    # The first REPLIES_KEPT and a count: thousands of replies would make result.json larger
    # than the agent reads inline (results.max_inline_kb).
    out = {"replies": replies[:REPLIES_KEPT], "reply_count": len(replies), "sent_ok": sent_ok}
    if error is not None:
        out["error"] = error
    return out


def open_fds() -> dict[str, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass  # the listing's own descriptor
    return out


def escape(attempt_id: str) -> dict:
    result_path = Path(os.environ["OARBANK_WORKDIR"]) / f"escape-{attempt_id}.json"  # writable
    parent = os.getpid()
    # The runner returns only once the child has its own session: an exit before that would
    # let the agent's end of the runner's group take the child with it (a test race, not the
    # behaviour under test).
    left_r, left_w = os.pipe()
    if os.fork() == 0:
        try:
            os.close(left_r)
            os.setsid()
            os.write(left_w, b"1")
            os.close(left_w)
            while os.getppid() == parent:
                time.sleep(0.02)
            # The agent ends the attempt right after the runner's group, closing its end of
            # the connector: it never writes on it unasked, so readable means that close.
            fd = int(os.environ["OARBANK_SERVICE_ECHO"].split(":", 1)[1])
            select.select([fd], [], [], 15)  # not closed within 15 s: the connect below says
            try:
                s = ep.connect("echo")
                outcome = {"connected": True, "pid": ask(s)}
            except ep.EndpointError as exc:
                outcome = {"connected": False, "code": exc.code, "detail": exc.detail}
            except OSError as exc:
                outcome = {"connected": False, "code": "oserror", "detail": str(exc)}
            write_json(str(result_path), outcome)
        finally:
            os._exit(0)
    os.close(left_w)
    left = os.read(left_r, 1)
    os.close(left_r)
    return {"escaped": left == b"1"}


def main() -> int:
    args = sys.argv[1:]
    spec = json.loads(Path(args[args.index("--spec") + 1]).read_text())
    workdir, out = args[args.index("--workdir") + 1], args[args.index("--out") + 1]
    payload = spec["payload"]
    attempt = int(os.environ["OARBANK_ATTEMPT_ID"].rsplit(".", 1)[1])
    mode = payload["mode"]
    if mode == "persistent":
        result = persistent(payload, attempt, workdir)
    elif mode == "fresh":
        result = fresh(payload)
    elif mode == "fds":
        fds = open_fds()
        result = {"fds": fds, "pid": ask(ep.connect("echo")) if payload.get("ask") else None,
                  "services": sorted(k for k in os.environ if k.startswith("OARBANK_SERVICE_"))}
    elif mode == "escape":
        result = escape(os.environ["OARBANK_ATTEMPT_ID"])
    else:
        result = hostile(payload)
    write_json(out, {"envelope": 1, "payload": result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
