"""What needs upstream's coordinator: placeholders that say why (the checker's words, from
``oarbank_sdk.page_forms``), and the catalogue of what this console draws itself."""

from __future__ import annotations

from typing import Any

from oarbank_sdk.page_forms import UPSTREAM_COMPONENTS

from .base import NOT_SUPPORTED, placeholder

__all__ = ["COORDINATOR", "OPERATION", "coordinator_placeholder"]

OPERATION = "it runs a module operation, which upstream's coordinator runs, not this portal"
_ARTIFACT = "it shows job artifacts, which upstream's coordinator serves, not this portal"
# Component types only a coordinator can serve -> why (the rest of upstream's catalogue is
# drawn here).
COORDINATOR = {
    **{t: UPSTREAM_COMPONENTS.get(t, OPERATION) for t in ("form", "action")},
    "filter_bar": UPSTREAM_COMPONENTS.get(
        "filter_bar", "its values are pushed to upstream's coordinator, which filters the "
                      "page's queries by them; this portal does not"),
    **{t: UPSTREAM_COMPONENTS.get(t, _ARTIFACT) for t in ("iframe", "media", "gallery",
                                                          "compare")},
}


def coordinator_placeholder(ctype: str, comp: dict[str, Any]) -> dict[str, Any]:
    """A placeholder saying why the component is not drawn here (as the checker says it)."""
    return placeholder(NOT_SUPPORTED, f"component type {ctype}", f"{ctype}: {COORDINATOR[ctype]}")
