"""``oarbank-agent``: run | submit | status | drain | reload | protect | demo.

Exit codes: 0 success (``submit --wait``: the job succeeded); 1 the agent is not running, the
job failed, or ``--timeout`` expired; 2 bad usage or input (malformed JSON, unknown module or
stage, a bad option or config key): nothing queued; 3 not permitted to reach the agent (its
control socket is its user's alone).

The parser and the dispatch are here; each command is in its own module: ``run`` in
``run_cli.py`` (its options in ``run_options.py``), ``submit``/``status``/``drain``/``reload`` in
``job_cli.py``, ``module`` in ``module_cli.py``, ``protect`` in ``protect_cli.py``, ``demo`` in
``demo.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from oarbank_agent import platform
from oarbank_agent.operate import protect_cli
from oarbank_agent.operate.cli_common import err as _err
from oarbank_agent.operate.job_cli import cmd_control, cmd_status, cmd_submit
from oarbank_agent.operate.module_cli import add_module_parser, cmd_module
from oarbank_agent.operate.run_cli import cmd_run, run_args
from oarbank_agent.operate.run_options import add_run_options, run_parser

__all__ = ["main", "build_parser", "run_parser"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="oarbank-agent", description="The oarbank node agent.")
    from oarbank_agent.modules.compat import version_line  # what a module's [requires] is matched against

    p.add_argument("--version", action="version", version=version_line())
    sub = p.add_subparsers(dest="command", required=True)

    asks = platform.current().requests
    r = sub.add_parser("run", help=f"run the agent in the foreground until {asks.stop_how} or "
                       f"Ctrl-C ({asks.stop_how} drains, {asks.reload_how} reloads)")
    add_run_options(r)
    _add_commands(p, sub)
    return p


def _add_commands(p: argparse.ArgumentParser, sub: Any) -> None:
    s = sub.add_parser("submit", help="submit a job to a running agent")
    s.add_argument("--state-dir", required=True, type=Path)
    s.add_argument("--module", required=True, help="module id or short name")
    s.add_argument("--stage", required=True)
    s.add_argument("--payload", required=True, help="the job's payload, a JSON object")
    s.add_argument("--wait", action="store_true", help="wait and print the final job record")
    s.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds")

    st = sub.add_parser("status", help="services and jobs of a running agent")
    st.add_argument("--state-dir", required=True, type=Path)
    st.add_argument("--json", action="store_true")
    st.add_argument("--page", type=int, default=1,
                    help="which page of jobs: 1 (default) the most recent")
    st.add_argument("--per-page", "--jobs", type=int, default=50, metavar="N",
                    help="jobs per page: --jobs N shows the last N (default 50; 0: every job), "
                         "with a count of the rest")

    asks = platform.current().requests
    for name, text in (("drain", "stop admitting, let running attempts finish (up to the "
                                 f"agent's --drain-s), then stop the agent (as {asks.stop_how})"),
                       ("reload", "re-read the config and settings files, apply new timings, "
                                  f"fingerprint again (as {asks.reload_how})")):
        c = sub.add_parser(name, help=text)
        c.add_argument("--state-dir", required=True, type=Path)

    protect_cli.add_protect_parser(sub)
    add_module_parser(sub)

    d = sub.add_parser("demo", help="twenty jobs through one warm model service")
    d.add_argument("--jobs", type=int, default=20)
    d.add_argument("--load-s", type=float, default=1.0)
    d.add_argument("--json", action="store_true")
    d.add_argument("--sandbox", choices=("auto", "required", "off"), default="auto",
                   help="the agent's --sandbox (off: debugging only)")
    d.add_argument("--compare", action="store_true",
                   help="then run the same jobs cold (each loads the model itself) and "
                        "print both")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.command == "run":
        run_argv = argv[argv.index("run") + 1:]
        try:
            ra = run_args(run_argv)
        except ValueError as exc:  # ConfigError, SettingsError: each names the file and key
            _err(str(exc))
            return 2
        return cmd_run(ra, run_argv)
    if args.command in ("drain", "reload"):
        return cmd_control(args)
    if args.command == "submit":
        return cmd_submit(args)
    if args.command == "status":
        return cmd_status(args)
    if args.command == "protect":
        return protect_cli.cmd_protect(args)
    if args.command == "module":
        return cmd_module(args)
    from oarbank_agent.operate.demo import run_demo

    return run_demo(jobs=args.jobs, load_s=args.load_s, as_json=args.json,
                    sandbox=args.sandbox, compare=args.compare)


if __name__ == "__main__":
    sys.exit(main())
