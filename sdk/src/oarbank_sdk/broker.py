"""Containers through the agent's broker (``OARBANK_BROKER``), by upstream's names
(``from oarbank_sdk import broker``). Standard library only.

    r = broker.run(image, ["tool", "--in", "/w/x"], mounts=[broker.Mount("inputs", "/w", ro=True)])

One request a connection: a JSON line ``{"op": "container.run" | "container.pull" | "status",
...}`` to the endpoint (``unix:/path``; Windows' ``npipe://./pipe/<name>``), one JSON line back,
``{"ok": true, ...}`` or ``{"ok": false, "error": code, "detail": text}``.

This agent runs no container broker: it never sets ``OARBANK_BROKER``, so ``available()`` is
False and every call raises ``BrokerError`` with code ``no_broker`` (docs/interop.md).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ENV", "BrokerError", "Mount", "Result", "available", "pull", "run", "status"]

ENV = "OARBANK_BROKER"


class BrokerError(RuntimeError):
    """The broker refused (or there is none): ``code`` and ``detail``."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


@dataclass
class Mount:
    src: str  # relative to the work directory, or "data:<path>" in the module's data dir
    dst: str  # absolute, inside the container
    ro: bool = False


@dataclass
class Result:
    exit_code: int
    stdout_tail: str = ""
    stderr_tail: str = ""
    stdout_path: str = ""  # relative to the work directory: all the output the agent kept
    stderr_path: str = ""
    duration_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def available() -> bool:
    """Whether this job was given a broker endpoint."""
    return bool(os.environ.get(ENV))


class _PipeStream:
    """A Windows named pipe opened as a file, with the two calls ``_call`` makes."""

    def __init__(self, name: str) -> None:
        self._f = open(name, "r+b", buffering=0)  # noqa: SIM115 - closed by close()

    def sendall(self, data: bytes) -> None:
        self._f.write(data)

    def recv(self, n: int) -> bytes:
        return self._f.read(n) or b""

    def close(self) -> None:
        self._f.close()


def _open(uri: str, timeout: float) -> Any:
    if uri.startswith("unix:"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(uri[len("unix:"):])
        except OSError:
            s.close()
            raise
        return s
    if uri.startswith("npipe:"):
        return _PipeStream("\\\\.\\pipe\\" + uri.rsplit("/", 1)[-1])
    raise BrokerError("bad_endpoint", f"{ENV}={uri!r} is neither unix:<path> nor npipe://...")


def _call(request: dict[str, Any], timeout: float) -> dict[str, Any]:
    uri = os.environ.get(ENV)
    if not uri:
        raise BrokerError("no_broker", f"{ENV} is not set: this job has no container broker "
                          "(this agent runs none)")
    stream = _open(uri, timeout)
    try:
        stream.sendall(json.dumps(request).encode("utf-8") + b"\n")
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = stream.recv(65536)
            if not chunk:
                break
            answer += chunk
    finally:
        stream.close()
    try:
        doc = json.loads(answer) if answer.strip() else {}
    except ValueError:
        raise BrokerError("bad_message", f"the broker's answer is not JSON: {answer[:200]!r}")
    if not isinstance(doc, dict) or doc.get("ok") is not True:
        doc = doc if isinstance(doc, dict) else {}
        raise BrokerError(str(doc.get("error") or "broker_error"),
                          str(doc.get("detail") or "the broker gave no answer"))
    return doc


def run(image: str, args: list[str], mounts: list[Mount] | None = None,
        platform: str = "linux/arm64", entrypoint: str | None = None,
        env: dict[str, str] | None = None, workdir: str | None = None, network: bool = False,
        timeout_s: float = 3600, cpus: float | None = None, mem_gb: float | None = None,
        gpus: str = "none") -> Result:
    """Run one container to its end through the agent; a container that fails returns its
    exit code, a refused request raises ``BrokerError``."""
    answer = _call({"op": "container.run", "image": image, "args": list(args),
                    "platform": platform, "entrypoint": entrypoint,
                    "mounts": [{"src": m.src, "dst": m.dst, "ro": m.ro} for m in mounts or ()],
                    "env": dict(env or {}), "workdir": workdir, "network": network,
                    "timeout_s": timeout_s, "cpus": cpus, "mem_gb": mem_gb, "gpus": gpus},
                   timeout_s + 120)
    known = ("exit_code", "stdout_tail", "stderr_tail", "stdout_path", "stderr_path",
             "duration_s")
    return Result(**{k: answer[k] for k in known if k in answer},
                  extra={k: v for k, v in answer.items() if k not in known and k != "ok"})


def pull(image: str, platform: str = "linux/arm64", timeout_s: float = 1800) -> dict[str, Any]:
    """Have the agent's runtime hold an approved image."""
    return _call({"op": "container.pull", "image": image, "platform": platform}, timeout_s + 60)


def status(timeout_s: float = 30) -> dict[str, Any]:
    """The runtime's state: ``{running, images, gpus}``."""
    return _call({"op": "status"}, timeout_s)
