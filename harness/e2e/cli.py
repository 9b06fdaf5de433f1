"""`python -m harness [--backend B] [--scenario NAME ...] [--out DIR] [--list] [--darwin-profile]`

Runs the end-to-end scenarios on the backends (every scenario on every backend this machine
can run when none is named), prints a progress line per scenario, writes `report.json` and
`report.md` into the out dir (default `.e2e/`), and exits 1 if anything failed (2 on bad
usage).

`--darwin-profile` (Linux, the local backend): every agent runs the macOS backend
(`OARBANK_PLATFORM=darwin`: no pipe2, pidfds, /proc, cgroups, Landlock or seccomp; a Linux-only
call fails naming itself), and the scenarios that need a Linux wall (`LINUX_WALLS`) are left out;
a Linux-only call in any agent's log (even one the agent swallowed) fails the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from harness.e2e.runner import run_matrix
from harness.e2e.scenario import SCENARIOS, use_modules_dir
from harness.nodes.backends import BACKEND_NAMES, make_backends
from harness.nodes.backends.base import Backend

__all__ = ["main", "LINUX_WALLS", "leave_out_what_cannot_show"]

PROFILE_ENV = "OARBANK_PLATFORM"  # oarbank_agent.platform.choice.ENV
TRIPWIRE = "oarbank tripwire:"  # what platform/darwin/linuxfree.py says on an agent's stderr
# The scenarios that prove a Linux wall, which the darwin profile (like a Mac) does not have.
LINUX_WALLS = {
    "listener-refused": "the Linux sandbox (seccomp) refuses the service's listen",
    "oom-limit": "cgroup v2 memory.max",
    "gpu-real": "the Linux sandbox around a CUDA service",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m harness", description=__doc__.split("\n\n")[1])
    p.add_argument("--backend", metavar="B",
                   help="local, container (both images), wine (Windows agents under Wine) or one of "
                        + ", ".join(n for n in BACKEND_NAMES if ":" in n)
                        + "; default: every backend this machine can run but vm and wine")
    p.add_argument("--scenario", action="append", metavar="NAME",
                   help="run only this scenario (repeatable); default: all")
    p.add_argument("--out", type=Path, default=Path(".e2e"),
                   help="folder for report.json, report.md and each run's files (default .e2e)")
    p.add_argument("--list", action="store_true", help="list the scenarios and backends")
    p.add_argument("--agent-flag", action="append", default=[], metavar="FLAG",
                   help="pass FLAG to every `oarbank-agent run` (harness tests use it to "
                        "break a behaviour on purpose)")
    p.add_argument("--modules-dir", type=Path, metavar="DIR",
                   help="take the test modules from DIR instead of harness/e2e/modules")
    p.add_argument("--darwin-profile", action="store_true",
                   help="Linux, local backend: the agents run the macOS backend "
                        "(OARBANK_PLATFORM=darwin); scenarios that need a Linux wall are left out")
    return p


def default_scenarios() -> list[str]:
    """What a run that names no scenario runs: every one but the opt-in ones."""
    return [n for n, sc in SCENARIOS.items() if sc.opt_in is None]


def leave_out_what_cannot_show(names: list[str], backends: list[Backend]
                               ) -> tuple[list[str], list[str]]:
    """A run that names no scenario: those no backend of the run can show (``cannot_show``)
    are left out, each with a line saying why."""
    out, notes = [], []
    for n in names:
        if backends and all(n in b.cannot_show for b in backends):
            notes += [f"[not on {b.name}] {n} not run: {b.cannot_show[n]}" for b in backends]
        else:
            out.append(n)
    return out, notes


def main(argv: list[str] | None = None) -> int:
    import harness.e2e.scenarios  # noqa: F401  (registers the scenarios)

    args = _parser().parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # a Windows console may not encode "—" or "⏎"
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")
    if args.list:
        for sc in SCENARIOS.values():
            print(f"{sc.name:20} {sc.summary}"
                  + (f" [opt-in: {sc.opt_in}]" if sc.opt_in else ""))
        print("backends: " + ", ".join(BACKEND_NAMES))
        return 0
    if args.modules_dir is not None:
        if not args.modules_dir.is_dir():
            print(f"python -m harness: --modules-dir {args.modules_dir}: not a folder",
                  file=sys.stderr)
            return 2
        use_modules_dir(args.modules_dir)
    if args.darwin_profile:
        if not sys.platform.startswith("linux") or args.backend not in (None, "local"):
            print("python -m harness: --darwin-profile runs on Linux with the local backend "
                  "only (the agents are processes here)", file=sys.stderr)
            return 2
        args.backend = "local"
        os.environ[PROFILE_ENV] = "darwin"  # inherited by every agent and CLI call
    try:
        backends = make_backends(args.backend)
    except ValueError as exc:
        print(f"python -m harness: {exc}", file=sys.stderr)
        return 2
    names = args.scenario or default_scenarios()
    if not args.scenario:
        for sc in SCENARIOS.values():
            if sc.opt_in is not None:
                print(f"[opt-in] {sc.name} not run (name it with --scenario {sc.name}): "
                      f"{sc.opt_in}")
    if not args.scenario:
        names, notes = leave_out_what_cannot_show(names, backends)
        for line in notes:
            print(line)
    if args.darwin_profile:
        for n in [n for n in names if n in LINUX_WALLS]:
            print(f"[linux only] {n} not run under the darwin profile: {LINUX_WALLS[n]}")
        names = [n for n in names if n not in LINUX_WALLS]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"python -m harness: unknown scenario(s) {', '.join(unknown)}; known: "
              + ", ".join(SCENARIOS), file=sys.stderr)
        return 2
    if not names:
        print("python -m harness: no scenarios are registered", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    args.out = args.out.resolve()  # agents and the portal are handed absolute paths
    report = run_matrix(backends, [SCENARIOS[n] for n in names], args.out,
                        tuple(args.agent_flag), required=args.backend is not None)
    j, m = report.write(args.out)
    print()
    print(report.to_markdown().split("\n## Evidence")[0].strip())
    print()
    print(f"report: {j} and {m}; {time.monotonic() - t0:.1f} s in total")
    if args.darwin_profile:
        tripped = sorted({f"{log.relative_to(args.out)}: {line.strip()}"
                          for log in args.out.glob("runs/**/agent.log")
                          for line in log.read_text(errors="replace").splitlines()
                          if TRIPWIRE in line})
        if tripped:  # a Linux-only call an agent made, even one it swallowed
            print("python -m harness: Linux-only calls under the darwin profile:\n  "
                  + "\n  ".join(tripped[:20]), file=sys.stderr)
            return 1
    if not report.results:
        print("python -m harness: no backend could run here: nothing was tested",
              file=sys.stderr)
        return 1
    return 0 if report.ok else 1
