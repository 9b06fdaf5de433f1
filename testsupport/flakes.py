"""The flake hunt (``nox -s flakes``): the suite, or a named part of it, several rounds under
CPU and disk load, with the socket tracer loaded; every test that failed in any round is
reported with its output, and every socket a test dropped unclosed with its stack.

    nox -s flakes                                   # the whole suite, 3 rounds, default load
    nox -s flakes -- --rounds 5 --cpu 4 --io 2 agent/tests/test_broker.py

A test that fails only sometimes fails CI only sometimes: run this on what you touched before
you submit. Exit status 1 when any test failed in any round or any socket was dropped.
The report is also written to ``.flakes/report.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testsupport.sockettrace import format_drops, read_drops

OUTPUT_LINES = 60  # of each failure's output in the report


@dataclass
class Outcome:
    """What one test did over the rounds."""

    failed_in: list[int] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)  # one per failed round


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="nox -s flakes --", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="times the tests run (default 3)")
    p.add_argument("--cpu", type=int, default=os.cpu_count() or 1,
                   help="processes spinning on the CPU during every round (default: one a core)")
    p.add_argument("--io", type=int, default=1,
                   help="processes writing and fsyncing files during every round (default 1)")
    p.add_argument("--workers", default=os.environ.get("OARBANK_TEST_WORKERS", "4"),
                   help="pytest-xdist workers (default: $OARBANK_TEST_WORKERS or 4)")
    p.add_argument("--out", type=Path, default=Path(".flakes"), help="reports (default .flakes)")
    p.add_argument("paths", nargs="*",
                   help="tests to run (default: the whole suite, pyproject's testpaths)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.cpu < 0 or args.io < 0:
        p.error("--rounds must be >= 1, --cpu and --io >= 0")
    return args


def longrepr_text(longrepr: Any) -> str:
    """A failure's traceback as pytest prints it, from its serialised form in the report log."""
    if longrepr is None or isinstance(longrepr, str):
        return longrepr or ""
    if isinstance(longrepr, list):  # a skip's (path, line, reason)
        return " ".join(map(str, longrepr))
    tracebacks = [c[0] for c in longrepr.get("chain") or []] or [longrepr.get("reprtraceback", {})]
    lines: list[str] = []
    for traceback in tracebacks:
        for entry in traceback.get("reprentries", []):
            data = entry.get("data", {})
            lines += data.get("lines", [])
            where = data.get("reprfileloc") or {}
            if where:
                lines.append(f"{where.get('path')}:{where.get('lineno')}: {where.get('message')}")
    crash = longrepr.get("reprcrash") or {}
    if crash:
        lines.append(f"{crash.get('path')}:{crash.get('lineno')}: {crash.get('message')}")
    return "\n".join(lines)


def read_outcomes(report_logs: list[Path]) -> dict[str, Outcome]:
    """Failures by test id from each round's pytest-reportlog file (round n = list index + 1)."""
    outcomes: dict[str, Outcome] = defaultdict(Outcome)
    for number, log in enumerate(report_logs, 1):
        if not log.exists():
            continue
        for line in log.read_text().splitlines():
            row = json.loads(line)
            if row.get("$report_type") != "TestReport" or row.get("outcome") != "failed":
                continue
            out = outcomes[row["nodeid"]]
            if number not in out.failed_in:
                out.failed_in.append(number)
            text = longrepr_text(row.get("longrepr"))
            sections = "".join(f"\n--- {name}\n{body}" for name, body in row.get("sections", []))
            out.outputs.append(f"round {number} ({row['when']}):\n{text}{sections}")
    return dict(outcomes)


def report(outcomes: dict[str, Outcome], drops: list[dict[str, Any]], rounds: int,
           load: str, took_s: float) -> str:
    lines = [f"# Flake hunt: {rounds} rounds under {load}, {took_s / 60:.1f} min", ""]
    if not outcomes and not drops:
        lines.append("No test failed in any round; no socket was dropped unclosed.")
    for nodeid, out in sorted(outcomes.items()):
        rounds_text = ", ".join(map(str, out.failed_in))
        lines += [f"## {nodeid}: failed in round(s) {rounds_text} of {rounds}", "", "```"]
        for text in out.outputs:
            lines += text.splitlines()[-OUTPUT_LINES:]
        lines += ["```", ""]
    if drops:
        lines += [f"## Sockets dropped unclosed: {len(drops)}", "", "```", *format_drops(drops),
                  "```"]
    return "\n".join(lines) + "\n"


def start_load(cpu: int, io: int, folder: str) -> subprocess.Popen[bytes] | None:
    if cpu == 0 and io == 0:
        return None
    return subprocess.Popen([sys.executable, "-m", "testsupport.load", "--cpu", str(cpu),
                             "--io", str(io), "--dir", folder], start_new_session=True)


def stop_load(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the spinners and writers are in its session
    except ProcessLookupError:
        pass
    proc.wait()


def run_round(number: int, args: argparse.Namespace, report_log: Path, trace_dir: Path) -> int:
    parallel = [] if args.workers == "1" else ["-n", args.workers, "--dist", "loadgroup"]
    cmd = [sys.executable, "-m", "pytest", *parallel, "-p", "testsupport.sockettrace",
           "--socket-trace", str(trace_dir), "--report-log", str(report_log),
           "-p", "no:cacheprovider", *args.paths]  # none: pyproject's testpaths
    print(f"flakes: round {number} of {args.rounds}: {' '.join(cmd[2:])}", flush=True)
    return subprocess.call(cmd)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    load_text = f"{args.cpu} CPU spinner(s) and {args.io} disk writer(s)"
    logs: list[Path] = []
    unrun: list[str] = []  # rounds in which no test ran: nothing was hunted there
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="oarbank-flakes-") as scratch:
        load = start_load(args.cpu, args.io, scratch)
        try:
            for number in range(1, args.rounds + 1):
                log = args.out / f"round-{number}.jsonl"
                log.unlink(missing_ok=True)
                rc = run_round(number, args, log, Path(scratch) / f"sockets-{number}")
                if not log.exists():  # pytest never ran the tests (a usage error, a crash)
                    unrun.append(f"round {number} (pytest exit {rc}, no report log)")
                logs.append(log)
        finally:
            stop_load(load)
        drops = [{**d, "test": f"round {n}: {d['test']}"} for n in range(1, args.rounds + 1)
                 for d in read_drops(Path(scratch) / f"sockets-{n}")]
    outcomes = read_outcomes(logs)
    text = report(outcomes, drops, args.rounds, load_text, time.monotonic() - t0)
    (args.out / "report.md").write_text(text)
    print(text)
    failed = ", ".join(f"{n} ({len(o.failed_in)}/{args.rounds})" for n, o in sorted(outcomes.items()))
    print(f"flakes: {len(outcomes)} test(s) failed in some round{': ' + failed if failed else ''}; "
          f"{len(drops)} socket(s) dropped unclosed; report in {args.out / 'report.md'}")
    if unrun:
        print(f"flakes: no test ran in {', '.join(unrun)}: not a clean hunt", file=sys.stderr)
    return 1 if outcomes or drops or unrun else 0


if __name__ == "__main__":
    raise SystemExit(main())
