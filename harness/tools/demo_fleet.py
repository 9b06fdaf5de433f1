"""``nox -s demo_fleet`` (``python -m harness.tools.demo_fleet``): fleet dispatch on this machine.

A portal (SQLite, in a temp dir) serving two modules (examples/modelserver, and the same under
a second id: ``harness/modelcopy.py``), three agents pulling work from it (``oarbank-agent run
--claim``), jobs of both modules submitted to the portal with its CLI (``oarbank-portal jobs
submit``: the first module's batch, then the second's with ``--wait`` and its progress bar),
then per node: the models it loaded and the jobs it ran, by placement (``ready``: its model
was warm; ``cold``: it was asked to load it). Everything it starts is stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness.modelcopy import MODELSERVER, modelserver_as

MODULES = ("dev.example.modelserver", "dev.example.modelserver-b")
NODES = ("node-1", "node-2", "node-3")


def _bin(name: str) -> list[str]:
    here = Path(sys.executable).parent / name
    if here.exists():
        return [str(here)]
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"demo_fleet: {name} is not installed (nox -s demo_fleet installs it)")
    return [found]


def _first_line(proc: subprocess.Popen[bytes], what: str, log: Path, timeout: float) -> str:
    assert proc.stdout is not None
    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise SystemExit(f"demo_fleet: {what} did not start; see {log}")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                raise SystemExit(f"demo_fleet: {what} exited:\n"
                                 + log.read_text(errors="replace")[-2000:])
            buf += chunk
    return buf.decode(errors="replace").splitlines()[0]


class Procs:
    """What the demo starts, each in its own session, all stopped at the end."""

    def __init__(self) -> None:
        self.procs: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(self, argv: list[str], log: Path, what: str) -> tuple[subprocess.Popen[bytes],
                                                                    str]:
        out = open(log, "ab")  # noqa: SIM115 - closed in stop()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=out,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append((p, out))
        return p, _first_line(p, what, log, 90.0)

    def stop(self) -> None:
        for p, _ in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p, out in reversed(self.procs):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)  # whatever its session left
            p.wait()
            if p.stdout:
                p.stdout.close()
            out.close()


def _token(db: Path, *who: str) -> str:
    r = subprocess.run([*_bin("oarbank-portal"), "token", "issue", *who, "--db", str(db)],
                       capture_output=True, text=True, timeout=120, check=True)
    return r.stdout.strip().splitlines()[-1]


def _secret(path: Path, text: str) -> Path:
    path.touch(mode=0o600)
    path.write_text(text + "\n")
    return path


def _get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 - the demo's own portal
        return json.loads(r.read())


def _batch_jobs(url: str, token: str, batch: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    after = ""
    while True:
        page = _get(f"{url}/v1/jobs?batch={batch}&limit=1000{after}", token)
        out += page
        if len(page) < 1000:
            return out
        after = f"&after={page[-1]['job_id']}"


def run(tmp: Path, jobs: tuple[int, int], load_s: float, hold_s: float) -> int:
    mods = [MODELSERVER, modelserver_as(tmp / "modelserver-b", MODULES[1])]
    db = tmp / "portal.db"
    sub = _secret(tmp / "submitter.token", _token(db, "--submitter", "demo"))
    procs = Procs()
    try:
        argv = [*_bin("oarbank-portal"), "serve", "--db", str(db), "--listen", "127.0.0.1:0"]
        for mod in mods:
            argv += ["--module", str(mod)]
        _p, line = procs.start(argv, tmp / "portal.log", "the portal")
        found = re.search(r"serving on (\S+)", line)
        if not found:
            raise SystemExit(f"demo_fleet: the portal said {line!r}")
        url = found.group(1)
        print(f"portal: {url} (SQLite {db}), serving {', '.join(MODULES)}", flush=True)
        for m in MODULES:
            (tmp / f"{m}.json").write_text(json.dumps({"load_s": load_s, "model_gb": 0.5}))
        for node in NODES:
            node_token = _secret(tmp / f"{node}.token", _token(db, node))
            argv = [*_bin("oarbank-agent"), "run", "--state-dir", str(tmp / node), "--node-id",
                    node, "--portal", url, "--portal-token-file", str(node_token), "--claim",
                    "--claim-wait-s", "2"]
            for m, path in zip(MODULES, mods, strict=True):
                argv += ["--module", str(path), "--settings", f"{m}={tmp / (m + '.json')}"]
            procs.start(argv, tmp / f"{node}.log", f"agent {node}")
            print(f"agent {node}: claiming from the portal (state {tmp / node})", flush=True)
        batches = []
        for i, (m, n) in enumerate(zip(MODULES, jobs, strict=True)):
            f = tmp / f"payloads-{i}.jsonl"
            f.write_text("".join(json.dumps({"prompts": [f"{m} job {k}"], "hold_s": hold_s})
                                 + "\n" for k in range(n)))
            cmd = [*_bin("oarbank-portal"), "jobs", "submit", "--portal", url, "--token-file",
                   str(sub), "--module", m, "--stage", "generate", "--file", str(f)]
            last = i == len(MODULES) - 1
            if last:
                cmd += ["--wait", "--out", str(tmp / "results.jsonl")]
            print(f"\n$ oarbank-portal jobs submit --module {m} --file {f.name}"
                  + (" --wait --out results.jsonl" if last else ""), flush=True)
            r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=900)
            ids = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
            batch = next((x["batch_id"] for x in ids if "batch_id" in x), None)
            print(f"{len(ids)} jobs of {m} submitted (batch {batch})")
            if r.returncode != 0 or batch is None:
                print(f"demo_fleet: jobs submit exited {r.returncode}", file=sys.stderr)
                return 1
            batches.append(batch)
        token = sub.read_text().strip()
        deadline = time.monotonic() + 600
        while True:  # the first batch, submitted without --wait
            records = [j for b in batches for j in _batch_jobs(url, token, b)]
            if all(j["state"] in ("succeeded", "failed", "cancelled") for j in records):
                break
            if time.monotonic() > deadline:
                print("demo_fleet: jobs still running after 600 s", file=sys.stderr)
                return 1
            time.sleep(0.5)
    finally:
        procs.stop()
    print(_summary(tmp, records))
    return 0 if all(j["state"] == "succeeded" for j in records) else 1


def _summary(tmp: Path, records: list[dict[str, Any]]) -> str:
    short = {m: m.rsplit(".", 1)[1] for m in MODULES}
    lines = ["", "per node: model loads, and the jobs it ran by placement "
                 "(ready: its model was warm; starting: it was loading; cold: asked to load it)",
             f"{'node':8} {'loads':34} jobs"]
    for node in NODES:
        loads = {}
        for m in MODULES:
            f = tmp / node / "modules" / m / "data" / "model.loads"
            loads[short[m]] = len(f.read_text().split()) if f.exists() else 0
        ran: dict[str, dict[str, int]] = {}
        for j in records:
            if j["node_id"] == node:
                per = ran.setdefault(short[j["module"]], {})
                per[j["placement"]] = per.get(j["placement"], 0) + 1
        lines.append(f"{node:8} {json.dumps(loads):34} {json.dumps(ran)}")
    ok = sum(j["state"] == "succeeded" for j in records)
    lines.append(f"\n{ok} of {len(records)} jobs succeeded; model loads in all: "
                 f"{_all_loads(tmp)}")
    return "\n".join(lines)


def _all_loads(tmp: Path) -> int:
    return sum(len(f.read_text().split()) for f in tmp.glob("node-*/modules/*/data/model.loads"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.tools.demo_fleet",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", default="40,20", metavar="A,B",
                   help="jobs of each module (default 40,20)")
    p.add_argument("--load-s", type=float, default=2.0, help="each model's load (default 2)")
    p.add_argument("--hold-s", type=float, default=0.3, help="each job's work (default 0.3)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, state)")
    args = p.parse_args(argv)
    try:
        a, b = (int(x) for x in args.jobs.split(","))
    except ValueError:
        p.error(f"--jobs takes two numbers A,B, got {args.jobs!r}")
    tmp = Path(tempfile.mkdtemp(prefix="ob-demo-fleet-"))
    try:
        return run(tmp, (a, b), args.load_s, args.hold_s)
    finally:
        if args.keep:
            print(f"demo_fleet: kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
