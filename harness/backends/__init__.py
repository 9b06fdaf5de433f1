"""Backends: where nodes run. `local` (agent processes here) and `container:<release>`
(Docker containers, Debian bookworm and trixie)."""

from __future__ import annotations

from harness.backends.base import Backend, CliResult, Node, NodeError
from harness.rootfs import RELEASES

__all__ = ["Backend", "CliResult", "Node", "NodeError", "BACKEND_NAMES", "make_backends"]

BACKEND_NAMES = ("local", *(f"container:{r}" for r in RELEASES))


def make_backends(spec: str | None) -> list[Backend]:
    """Backends for `--backend SPEC`: `local`, `container` (every release) or
    `container:<release>`; None = every backend. ValueError names what is known."""
    from harness.backends.container import ContainerBackend
    from harness.backends.local import LocalBackend

    if spec is None:
        names = list(BACKEND_NAMES)
    elif spec == "container":
        names = [n for n in BACKEND_NAMES if n.startswith("container:")]
    elif spec in BACKEND_NAMES:
        names = [spec]
    else:
        raise ValueError(f"unknown backend {spec!r}; known: local, container, "
                         + ", ".join(n for n in BACKEND_NAMES if ":" in n))
    out: list[Backend] = []
    for n in names:
        out.append(LocalBackend() if n == "local" else ContainerBackend(n.split(":", 1)[1]))
    return out
