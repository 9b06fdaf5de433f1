"""``requires.ui_contract`` at page load (contract section 1): a module whose range does not
include this portal's UI contract gets, instead of its pages and panels, a notice that names
the range and the portal's version (``notice``, pure). Its documents are not read nor drawn:
they are written against a contract this portal does not implement, and a page half drawn
would look broken for no stated reason.

A module without ``ui_contract`` (the checker requires it once pages are declared) is drawn
as always; a range the portal cannot read is named in the notice too.
"""

from __future__ import annotations

from typing import Any

from oarbank_sdk.versions import RangeError, allows

from .render import HOST_CONTRACT

__all__ = ["PORTAL_UI_CONTRACT", "notice"]

PORTAL_UI_CONTRACT = ".".join(str(n) for n in HOST_CONTRACT)  # "1.2"


def notice(module_id: str, raw_manifest: dict[str, Any]) -> str | None:
    """What the module's pages show instead of themselves, or None when they are drawn."""
    requires = raw_manifest.get("requires")
    wanted = requires.get("ui_contract") if isinstance(requires, dict) else None
    if not isinstance(wanted, str):
        return None
    try:
        if allows(wanted, PORTAL_UI_CONTRACT):
            return None
        why = "which does not include"
    except RangeError as exc:
        why = f"which this portal cannot read ({exc}); so it cannot include"
    return (f"Not shown: {module_id} requires UI contract {wanted} (requires.ui_contract), "
            f"{why} this portal's UI contract {PORTAL_UI_CONTRACT}. Use a version of the "
            f"module whose range includes {PORTAL_UI_CONTRACT}, or a portal that implements "
            "the contract it asks for.")
