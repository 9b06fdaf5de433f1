"""A parser's options as they were added: ``Recorder`` passes each ``add_argument`` on to the
parser (or to one of its groups) and keeps the ``Action`` it returns, in order.

What reads a parser's options (the README's table: optiontable.py; the config file's keys:
config.py) reads them here, not from argparse's private lists.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["Recorder", "expand_help"]


class Recorder:
    """``parser`` (or a group of it) whose options are kept in ``actions``."""

    def __init__(self, parser: Any, actions: list[argparse.Action] | None = None,
                 kinds: dict[str, str | None] | None = None) -> None:
        self.parser = parser
        self.actions: list[argparse.Action] = [] if actions is None else actions
        self._kinds: dict[str, str | None] = {} if kinds is None else kinds

    def add_argument(self, *flags: str, **kwargs: Any) -> argparse.Action:
        action: argparse.Action = self.parser.add_argument(*flags, **kwargs)
        self.actions.append(action)
        self._kinds[action.dest] = kwargs.get("action")
        return action

    def kind(self, action: argparse.Action) -> str | None:
        """The ``action=`` it was added with (``store_true``, ``append``...; None: store)."""
        return self._kinds.get(action.dest)

    def add_argument_group(self, title: str | None = None,
                           description: str | None = None) -> Recorder:
        """A group of the parser (as ``--help`` shows it) whose options are kept here too."""
        return Recorder(self.parser.add_argument_group(title, description), self.actions,
                        self._kinds)


def expand_help(action: argparse.Action, prog: str) -> str:
    """The option's help as ``--help`` prints it: ``%(default)s``, ``%(choices)s``,
    ``%(prog)s`` and the like filled in, ``%%`` a ``%``."""
    if not action.help:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    for k, v in list(params.items()):
        if hasattr(v, "__name__"):
            params[k] = v.__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    params["prog"] = prog
    return action.help % params
