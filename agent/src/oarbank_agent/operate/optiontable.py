"""The README's table of ``run`` options, generated from the options as they are added to the
parser (``run_options.run_options``: no private argparse list is read), so the two never differ.

``python -m oarbank_agent.operate.optiontable`` prints it; ``--write agent/README.md`` replaces the
table between its markers. ``agent/tests/test_readme_options.py`` fails when the README's table
is not what the parser says (each option's help is its README row).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from oarbank_agent.operate.options import expand_help

__all__ = ["BEGIN", "END", "markdown", "replace_in"]

BEGIN = ("<!-- run options: generated from the parser by `python -m oarbank_agent.operate.optiontable "
         "--write agent/README.md`; do not edit by hand -->")
END = "<!-- end of run options -->"


def _name(a: argparse.Action) -> str:
    flag = max(a.option_strings, key=len)
    if a.nargs == 0:
        return f"`{flag}`"
    if a.choices:  # `--sandbox auto\|required\|off` (a | escaped inside a table cell)
        return f"`{flag} " + "\\|".join(str(c) for c in a.choices) + "`"
    return f"`{flag} {a.metavar or a.dest.upper()}`"


def markdown(options: Iterable[argparse.Action], prog: str = "oarbank-agent run") -> str:
    """A row per option (positionals left out), its help as ``--help`` prints it."""
    rows = ["| option | meaning |", "|---|---|"]
    for a in options:
        if not a.option_strings:
            continue
        text = expand_help(a, prog)
        rows.append(f"| {_name(a)} | {text.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def replace_in(text: str, table: str) -> str:
    """``text`` with the part between the markers replaced by ``table``. Raises ValueError."""
    try:
        head, rest = text.split(BEGIN, 1)
        _old, tail = rest.split(END, 1)
    except ValueError:
        raise ValueError(f"the markers are missing: {BEGIN!r} ... {END!r}") from None
    return f"{head}{BEGIN}\n{table}\n{END}{tail}"


def main(argv: list[str]) -> int:
    from oarbank_agent.operate.run_options import PROG, run_options

    table = markdown(run_options().actions, PROG)
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        path.write_text(replace_in(path.read_text(encoding="utf-8"), table), encoding="utf-8")
        return 0
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
