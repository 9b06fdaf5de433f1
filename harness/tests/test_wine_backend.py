"""The `wine` backend's choice and paths, without Wine: it is opt-in (never run unnamed), the
agent sees the node's files through Z:, and the portal it is given is TCP loopback. The
backend itself runs with `nox -s e2e -- --backend wine` (harness/README.md)."""

from __future__ import annotations

from pathlib import Path

from harness.nodes.backends import make_backends
from harness.nodes.backends.wine import WineBackend, WineNode


def test_wine_runs_only_when_named() -> None:
    assert not any(b.name == "wine" for b in make_backends(None))
    [b] = make_backends("wine")
    assert isinstance(b, WineBackend) and b.portal_over_tcp


def test_the_agent_sees_the_node_folder_through_z(tmp_path: Path) -> None:
    node = WineNode(node_id="n", root=tmp_path, modules=[])
    assert node.host_to_node(tmp_path / "state") == "Z:" + str(tmp_path.resolve() / "state"
                                                                 ).replace("/", "\\")


def test_a_run_naming_no_scenario_leaves_out_what_wine_cannot_show() -> None:
    """`--backend wine` alone runs every scenario but those Wine's agent cannot show, each
    left out with a line naming why; named, one runs (and fails saying what is missing)."""
    import harness.e2e.scenarios  # noqa: F401  (registers the scenarios)
    from harness.e2e.cli import default_scenarios, leave_out_what_cannot_show

    names, notes = leave_out_what_cannot_show(default_scenarios(), make_backends("wine"))
    assert "listener-refused" not in names and "agent-upgrade" not in names
    assert {"idle-stop", "crash-loop", "agent-restart", "yield"} <= set(names)
    assert any(n.startswith("[not on wine] listener-refused not run: ")
               and "AppContainer" in n for n in notes), notes
    # the local backend shows them all: nothing left out there, nor in a mixed run
    assert leave_out_what_cannot_show(["listener-refused"], make_backends("local")) == (
        ["listener-refused"], [])
    assert leave_out_what_cannot_show(
        ["listener-refused"], make_backends("local") + make_backends("wine"))[0] == [
        "listener-refused"]
