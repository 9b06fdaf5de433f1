"""`requires.ui_contract` at page load (issue 15, part 1): a module whose range leaves out the
portal's UI contract 1.2 gets a notice naming the range and the portal's version on its pages
and panels (HTML and the refresh's JSON), not its documents drawn half-broken. The pure rule,
then a real `oarbank-portal serve` with a copy of the example module."""

from __future__ import annotations

import shutil
from pathlib import Path

from markupsafe import escape

from oarbank_ui.pages.uicontract import PORTAL_UI_CONTRACT, notice

MOD = "dev.example.modelserver"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "modelserver"


def _raw(ui_contract: object) -> dict:
    return {"requires": {"ui_contract": ui_contract}}


def test_only_a_range_that_leaves_out_the_portal_gets_a_notice() -> None:
    assert PORTAL_UI_CONTRACT == "1.2"
    for ok in (">=1.2,<2", ">=1.0", "~=1.1", "==1.*", "<=1.2"):
        assert notice("m.x", _raw(ok)) is None, ok
    assert notice("m.x", {"requires": {}}) is None and notice("m.x", {}) is None
    text = notice("m.x", _raw(">=1.3,<2"))
    assert text == ("Not shown: m.x requires UI contract >=1.3,<2 (requires.ui_contract), "
                    "which does not include this portal's UI contract 1.2. Use a version of "
                    "the module whose range includes 1.2, or a portal that implements the "
                    "contract it asks for.")
    assert "which does not include this portal's UI contract 1.2" in notice("m.x", _raw(">=2"))
    bad = notice("m.x", _raw("about 1.2"))
    assert bad is not None and "which this portal cannot read" in bad


def test_a_module_asking_for_a_newer_ui_contract_gets_a_notice_page(start_portal,
                                                                    tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    mod = tmp_path / "modelserver"
    shutil.copytree(EXAMPLE, mod, ignore=shutil.ignore_patterns("__pycache__"))
    toml = mod / "oarbank-module.toml"
    text = toml.read_text()
    assert 'ui_contract = ">=1.2,<2"' in text
    toml.write_text(text.replace('ui_contract = ">=1.2,<2"', 'ui_contract = ">=1.3,<2"'))
    p = start_portal(mod)
    expected = notice(MOD, {"requires": {"ui_contract": ">=1.3,<2"}})
    assert expected is not None
    page = p.get(f"/modules/{MOD}/pages/overview")
    assert page.status == 200
    assert f'<p class="notice" role="alert">{escape(expected)}</p>' in page.text
    assert "<table" not in page.text and "data-refresh-url" not in page.text
    assert p.get("/modules/modelserver/pages/overview?format=json").json()["notice"] == expected
    panel = p.get("/nodes/n1/modules/modelserver/panels/node")
    assert panel.status == 200 and escape(expected) in panel.text
    data = p.get("/nodes/n1/modules/modelserver/panels/node?format=json").json()
    assert (data["components"], data["notice"]) == ({}, expected)
