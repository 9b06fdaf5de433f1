"""The README's table of `run` options is the parser's (optiontable.py): an option added,
removed or reworded in cli.py fails here until `python -m oarbank_agent.operate.optiontable --write
agent/README.md` is run."""

from __future__ import annotations

import argparse

from agent_helpers import REPO

from oarbank_agent.operate import cli, optiontable


def test_the_readme_table_is_the_parsers() -> None:
    readme = (REPO / "agent" / "README.md").read_text(encoding="utf-8")
    table = optiontable.markdown(cli.run_parser())
    assert optiontable.replace_in(readme, table) == readme, (
        "agent/README.md's run options differ from the parser: run "
        "`python -m oarbank_agent.operate.optiontable --write agent/README.md`")


def test_every_run_option_has_a_row_and_a_meaning() -> None:
    parser = cli.run_parser()
    table = optiontable.markdown(parser)
    for a in parser._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        flag = max(a.option_strings, key=len)
        assert f"| `{flag}" in table, flag
        assert a.help, f"{flag} has no help: its README row would say nothing"
    # the ones the issue found missing
    assert "| `--containment " in table and "| `--status-poll-s S` |" in table


def test_a_changed_help_is_noticed() -> None:
    readme = (REPO / "agent" / "README.md").read_text(encoding="utf-8")
    parser = cli.run_parser()
    next(a for a in parser._actions if a.dest == "drain_s").help = "something else"
    assert optiontable.replace_in(readme, optiontable.markdown(parser)) != readme
