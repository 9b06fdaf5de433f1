"""The ``oarbank-sdk`` command line.

- ``oarbank-sdk check PATH...``: check manifests (module folder or its toml) and the pages and
  panels they list. Valid: ``<path>: ok <module id> <version>``, then one
  ``note <key path>: <message>`` line per key or source of upstream's that is accepted without
  being acted on (``pages.module_notes``); invalid: ``<path>: INVALID`` then one
  ``<key path>: <message>`` line per problem. Exit 0 all valid, 1 any invalid, 2 bad command
  line.
- ``oarbank-sdk conform MODULE_DIR [--json] [--keep]``: the conformance kit
  (``oarbank_sdk.conform``).
- ``oarbank-sdk new DIR --id ID --service NAME --stage NAME [--from PATH]``: a module made
  from the reference example with those names (``oarbank_sdk.scaffold``). Exit 0 written,
  2 bad names or DIR not empty.

- ``oarbank-sdk deps compile MODULE_DIR REQUIREMENTS_IN [--platforms LIST] [--pip]``: the
  hashed ``requirements.txt`` beside ``REQUIREMENTS_IN``; ``oarbank-sdk bundle wheels DIR``:
  its wheels into ``DIR/wheels`` (``oarbank_sdk.deps``). Exit 0 done, 1 it could not be.

Adding a subcommand: write ``_cmd_<name>(args) -> int`` and one ``_add_<name>(sub)`` that
registers its arguments and sets ``func``; list it in ``_SUBCOMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]

# What ``add_subparsers`` returns (its class is argparse's private one).
Subparsers = Any


# -- check ----------------------------------------------------------------------------------


def _cmd_check(args: argparse.Namespace) -> int:
    from . import manifest as _manifest
    from . import pages as _pages

    status = 0
    for path in args.paths:
        found, problems = _manifest.check(Path(path))
        if found is not None:
            problems = _pages.check_module_pages(found)
        if problems:
            status = 1
            print(f"{path}: INVALID")
            for problem in problems:
                print(f"{problem.key}: {problem.message}")
        else:
            assert found is not None
            print(f"{path}: ok {found.id} {found.version}")
            for note in _pages.module_notes(found):
                print(f"note {note.key}: {note.message}")
    return status


def _add_check(sub: Subparsers) -> None:
    p = sub.add_parser(
        "check",
        help="check module manifests and their UI pages",
        description="Check oarbank-module.toml (and the [ui] pages and panels it lists).",
    )
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a module folder or its oarbank-module.toml")
    p.set_defaults(func=_cmd_check)


# -- conform --------------------------------------------------------------------------------


def _cmd_conform(args: argparse.Namespace) -> int:
    # Imported lazily: the kit pulls in process and sandbox code that `check` does not need.
    try:
        from .conform import run
    except ModuleNotFoundError as e:
        if e.name != f"{__package__}.conform":
            raise
        print("oarbank-sdk conform: the conformance kit is not in this installation",
              file=sys.stderr)
        return 2
    return int(run(args.module_dir, json_output=args.json, keep=args.keep))


def _add_conform(sub: Subparsers) -> None:
    p = sub.add_parser(
        "conform",
        help="run the conformance kit on a module",
        description="Start the module's services as an agent does and run its goldens and "
        "service_specs through them.",
    )
    p.add_argument("module_dir", metavar="MODULE_DIR", help="the module folder")
    p.add_argument("--json", action="store_true", help="print a machine-readable report")
    p.add_argument("--keep", action="store_true",
                   help="keep the node folder (the module's data folder, every op's output, "
                   "each attempt) and print where it is")
    p.set_defaults(func=_cmd_conform)


# -- new ------------------------------------------------------------------------------------


def _cmd_new(args: argparse.Namespace) -> int:
    from .scaffold import ScaffoldError, new_module

    try:
        files = new_module(Path(args.dir), args.id, args.service, args.stage, args.template)
    except ScaffoldError as exc:
        print(f"oarbank-sdk new: {exc}", file=sys.stderr)
        return 2
    print(f"{args.dir}: {args.id} with service {args.service!r} and stage {args.stage!r} "
          f"({len(files)} files); next: oarbank-sdk check {args.dir} && "
          f"oarbank-sdk conform {args.dir}")
    return 0


def _add_new(sub: Subparsers) -> None:
    p = sub.add_parser(
        "new",
        help="make a module from the reference example",
        description="Copy the reference module (examples/modelserver) into DIR with its module "
        "id, service (and pool) and stage renamed everywhere they live.",
    )
    p.add_argument("dir", metavar="DIR", help="the new module's folder (new or empty)")
    p.add_argument("--id", required=True, help="module id, reverse DNS: com.acme.scorer")
    p.add_argument("--service", required=True, help="the service's (and its pool's) name")
    p.add_argument("--stage", required=True, help="the stage's name")
    p.add_argument("--from", dest="template", type=Path, default=None, metavar="PATH",
                   help="the reference module to copy (default: the repository's "
                   "examples/modelserver)")
    p.set_defaults(func=_cmd_new)


# -- deps compile / bundle wheels -----------------------------------------------------------


def _platform_list(text: str | None) -> list[str] | None:
    return [t.strip() for t in text.split(",") if t.strip()] if text else None


def _cmd_deps(args: argparse.Namespace) -> int:
    from . import manifest as _manifest
    from .deps import DepsError, compile_requirements

    try:
        out = compile_requirements(Path(args.module_dir), Path(args.requirements_in),
                                   use_uv=False if args.pip else None,
                                   platforms=_platform_list(args.platforms))
    except (DepsError, _manifest.ManifestError, OSError) as exc:
        print(f"oarbank-sdk deps compile: {exc}", file=sys.stderr)
        return 1
    print(f"{out}: written; next: oarbank-sdk bundle wheels {args.module_dir}")
    return 0


def _add_deps(sub: Subparsers) -> None:
    p = sub.add_parser("deps", help="pin a module environment's dependencies",
                       description="Module environments (contract section 4).")
    acts = p.add_subparsers(dest="deps_command", metavar="ACTION", required=True)
    c = acts.add_parser("compile", help="resolve requirements.in into a hashed requirements.txt",
                        description="Resolve REQUIREMENTS_IN for every platform the module "
                        "lists (uv where on PATH, else pip) and write requirements.txt beside it: "
                        "exact pins with every platform's wheel hashes, no options, no markers.")
    c.add_argument("module_dir", metavar="MODULE_DIR")
    c.add_argument("requirements_in", metavar="REQUIREMENTS_IN",
                   help="what the script needs (beside the script: requirements.in)")
    c.add_argument("--platforms", default=None, metavar="LIST",
                   help="comma-separated platform tokens (default: requires.platforms, else "
                   "this machine's)")
    c.add_argument("--pip", action="store_true", help="resolve with pip even where uv is on PATH")
    c.set_defaults(func=_cmd_deps)


def _cmd_bundle(args: argparse.Namespace) -> int:
    from . import manifest as _manifest
    from .deps import DepsError, bundle_wheels

    try:
        problems = bundle_wheels(Path(args.dir), platforms=_platform_list(args.platforms))
    except (DepsError, _manifest.ManifestError, OSError) as exc:
        print(f"oarbank-sdk bundle wheels: {exc}", file=sys.stderr)
        return 1
    for problem in problems:
        print(problem)
    if not problems:
        print(f"{args.dir}/wheels: covers every pin")
    return 1 if problems else 0


def _add_bundle(sub: Subparsers) -> None:
    p = sub.add_parser("bundle", help="put a module environment's wheels into the bundle",
                       description="Module environments (contract section 4).")
    acts = p.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    w = acts.add_parser("wheels", help="download every pinned wheel into <dir>/wheels",
                        description="For each requirements.txt the module's exec uses and each "
                        "platform, download the pinned wheels (hash-checked) into DIR/wheels.")
    w.add_argument("dir", metavar="DIR", help="the module folder")
    w.add_argument("--platforms", default=None, metavar="LIST",
                   help="comma-separated platform tokens (default: requires.platforms, else "
                   "this machine's)")
    w.set_defaults(func=_cmd_bundle)


# -- wiring ---------------------------------------------------------------------------------

_SUBCOMMANDS: list[Callable[[Subparsers], None]] = [_add_check, _add_conform,
                                                                    _add_new, _add_deps,
                                                                    _add_bundle]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oarbank-sdk", description="oarbank module tools")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 with a usage message on a bad command line
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
