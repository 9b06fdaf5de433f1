"""The second demo: N openai-client jobs through one warm FastAPI service on a real agent.

    python examples/openai-compatible/demo.py [--jobs 12] [--load-s 2] [--json]
    nox -s demo_openai -- --jobs 12

Starts ``oarbank-agent run`` (its own session, a temporary state dir, this module), submits N
``chat`` jobs at once with ``oarbank-agent submit --wait`` (half of them streamed), prints what
came back (every answer from one service process that loaded the model once), then stops the
agent and removes what it made. Uses the agent's command line only, as a person would.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
AGENT = [sys.executable, "-m", "oarbank_agent"]
PROMPTS = ["warm services load once", "nothing listens", "three lines change"]


def start_agent(tmp: Path, load_s: float) -> subprocess.Popen[bytes]:
    settings = tmp / "settings.json"
    settings.write_text(json.dumps({"load_s": load_s, "slots": 4}))
    log = open(tmp / "agent.log", "ab")  # noqa: SIM115 (the agent holds it)
    proc = subprocess.Popen([*AGENT, "run", "--state-dir", str(tmp / "state"), "--node-id",
                             "demo-node", "--module", str(HERE), "--settings",
                             f"openai-compatible={settings}"], stdout=subprocess.PIPE,
                            stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    assert proc.stdout is not None
    if not proc.stdout.readline():  # one line once its control socket listens
        raise RuntimeError("the agent exited before it was ready:\n"
                           + (tmp / "agent.log").read_text(errors="replace")[-2000:])
    return proc


def stop_agent(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # it drains, then ends what it started
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of its session is left
    except ProcessLookupError:
        pass
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def submit(state: Path, payload: dict) -> dict:
    out = subprocess.run([*AGENT, "submit", "--state-dir", str(state), "--module",
                          "openai-compatible", "--stage", "chat", "--payload",
                          json.dumps(payload), "--wait", "--timeout", "300"],
                         capture_output=True, text=True, timeout=360)
    if out.returncode != 0:
        raise RuntimeError(f"submit failed ({out.returncode}): {out.stderr[-500:]}")
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="demo.py", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--load-s", type=float, default=2.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="oarbank-openai-demo-"))
    t0 = time.monotonic()
    agent = start_agent(tmp, args.load_s)
    try:
        payloads = [{"prompts": PROMPTS, "stream": i % 2 == 1} for i in range(args.jobs)]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            jobs = list(pool.map(lambda p: submit(tmp / "state", p), payloads))
        wall = time.monotonic() - t0
    finally:
        stop_agent(agent)
        shutil.rmtree(tmp, ignore_errors=True)
    ok = [j for j in jobs if j.get("state") == "succeeded"]
    services = sorted({s for j in ok for s in j["result"]["provenance"]["service"]})
    firsts = sorted(t for j in ok for t in j["result"]["provenance"].get("first_token_s", []))
    summary = {"jobs": args.jobs, "succeeded": len(ok), "wall_s": round(wall, 2),
               "service_processes": services,
               "first_token_ms_median": round(firsts[len(firsts) // 2] * 1000, 1) if firsts else None,
               "texts": ok[0]["result"]["payload"]["texts"] if ok else []}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{len(ok)}/{args.jobs} jobs succeeded in {wall:.2f} s (agent start and one "
              f"{args.load_s:g} s model load included)")
        print(f"served by: {', '.join(services) or '-'} (pid and model loads of each process)")
        if firsts:
            print(f"streamed jobs: first token after {summary['first_token_ms_median']} ms (median)")
        for p, t in zip(PROMPTS, summary["texts"], strict=False):
            print(f"  {p!r} -> {t!r}")
    return 0 if len(ok) == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
