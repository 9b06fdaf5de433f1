"""Drawing views as HTML with Jinja2 (autoescaping on for every template: every string a
module, a node or a heartbeat supplies is escaped)."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import jinja2

__all__ = ["Templates", "clock_text"]


def clock_text(t: float) -> str:
    return _dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


class Templates:
    def __init__(self, *, static: str = "/static", home: str = "/") -> None:
        self.static = static
        self.home = home
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("oarbank_ui.pages", "templates"),
            autoescape=True,  # all templates are HTML
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )

    def render(self, template: str, **values: Any) -> str:
        values.setdefault("crumbs", [])
        return self.env.get_template(template).render(static=self.static, home=self.home,
                                                      **values)
