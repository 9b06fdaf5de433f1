"""The README's table of `run` options is the parser's (optiontable.py): an option added,
removed or reworded in run_options.py fails here until `python -m oarbank_agent.operate.optiontable --write
agent/README.md` is run. The options are read as they were added (options.Recorder), never
from argparse's private lists."""

from __future__ import annotations

from agent_helpers import REPO

from oarbank_agent.operate import optiontable, run_options


def test_the_readme_table_is_the_parsers() -> None:
    readme = (REPO / "agent" / "README.md").read_text(encoding="utf-8")
    table = optiontable.markdown(run_options.run_options().actions)
    assert optiontable.replace_in(readme, table) == readme, (
        "agent/README.md's run options differ from the parser: run "
        "`python -m oarbank_agent.operate.optiontable --write agent/README.md`")


def test_every_run_option_has_a_row_and_a_meaning() -> None:
    made = run_options.run_options()
    parser, options = made.parser, made.actions
    table = optiontable.markdown(options)
    # every option the parser has was recorded (each dest of a parse with nothing given)
    assert {a.dest for a in options} == set(vars(parser.parse_args([])))
    for a in options:
        flag = max(a.option_strings, key=len)
        assert f"| `{flag}" in table, flag
        assert a.help, f"{flag} has no help: its README row would say nothing"
    # the ones the issue found missing
    assert "| `--containment " in table and "| `--status-poll-s S` |" in table


def test_a_changed_help_is_noticed() -> None:
    readme = (REPO / "agent" / "README.md").read_text(encoding="utf-8")
    options = run_options.run_options().actions
    next(a for a in options if a.dest == "drain_s").help = "something else"
    assert optiontable.replace_in(readme, optiontable.markdown(options)) != readme


def test_help_is_expanded_as_help_prints_it() -> None:
    table = optiontable.markdown(run_options.run_options().actions)
    assert "(0.12 or 12%; default 12%)" in table  # `%%` in the help is one `%`
