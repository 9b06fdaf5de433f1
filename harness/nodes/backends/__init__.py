"""Backends: where nodes run. `local` (agent processes here), `container:<release>`
(Docker containers, Debian bookworm and trixie), `vm:bookworm` (QEMU VMs booting Debian's
kernel under systemd) and `wine` (Windows agents, Windows' own python.exe under Wine); the last
two are opt-in: only when named, as they are slow (no KVM) or not Linux."""

from __future__ import annotations

from harness.nodes.backends.base import Backend, CliResult, Node, NodeError
from harness.nodes.rootfs import RELEASES

__all__ = ["Backend", "CliResult", "Node", "NodeError", "BACKEND_NAMES", "make_backends"]

BACKEND_NAMES = ("local", *(f"container:{r}" for r in RELEASES), "vm:bookworm", "wine")
OPT_IN = ("vm:bookworm", "wine")  # run only when named (`--backend vm`, `--backend wine`)


def make_backends(spec: str | None) -> list[Backend]:
    """Backends for `--backend SPEC`: `local`, `container` (every release),
    `container:<release>`, `vm`, `vm:bookworm` or `wine`; None = every backend but the opt-in ones.
    ValueError names what is known."""
    from harness.nodes.backends.container import ContainerBackend
    from harness.nodes.backends.local import LocalBackend
    from harness.nodes.backends.vm import VmBackend
    from harness.nodes.backends.wine import WineBackend

    if spec is None:
        names = [n for n in BACKEND_NAMES if n not in OPT_IN]
    elif spec in ("container", "vm"):
        names = [n for n in BACKEND_NAMES if n.startswith(f"{spec}:")]
    elif spec in BACKEND_NAMES:
        names = [spec]
    else:
        raise ValueError(f"unknown backend {spec!r}; known: local, container, vm, wine, "
                         + ", ".join(n for n in BACKEND_NAMES if ":" in n))
    out: list[Backend] = []
    for n in names:
        kind, _, release = n.partition(":")
        if kind == "wine":
            out.append(WineBackend())
            continue
        out.append(LocalBackend() if kind == "local" else ContainerBackend(release)
                   if kind == "container" else VmBackend(release))
    return out
