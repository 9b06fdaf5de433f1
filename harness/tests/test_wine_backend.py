"""The `wine` backend's choice and paths, without Wine: it is opt-in (never run unnamed), the
agent sees the node's files through Z:, and the portal it is given is TCP loopback. The
backend itself runs with `nox -s e2e -- --backend wine` (harness/README.md)."""

from __future__ import annotations

from pathlib import Path

from harness.backends import make_backends
from harness.backends.wine import WineBackend, WineNode


def test_wine_runs_only_when_named() -> None:
    assert not any(b.name == "wine" for b in make_backends(None))
    [b] = make_backends("wine")
    assert isinstance(b, WineBackend) and b.portal_over_tcp


def test_the_agent_sees_the_node_folder_through_z(tmp_path: Path) -> None:
    node = WineNode(node_id="n", root=tmp_path, modules=[])
    assert node.host_to_node(tmp_path / "state") == "Z:" + str(tmp_path.resolve() / "state"
                                                                 ).replace("/", "\\")
