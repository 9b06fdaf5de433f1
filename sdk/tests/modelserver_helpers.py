"""Running a module made from examples/modelserver with real processes, the test playing the
agent (test_modelserver_example.py on our SDK, test_modelserver_portable.py on a stand-in for
upstream's): its service's ops in their own process groups with the contract's op environment,
a real channel socketpair that `start` passes on, connections handed with SCM_RIGHTS
(``oarbank_sdk.conform.host``), its runner with a real connector.

``argv`` is how to run a script: the manifest's exec expanded (``python`` is this interpreter),
or the same with another interpreter in its place (``with_python``)."""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path

from oarbank_sdk.conform import host
from oarbank_sdk.manifest import expand_exec, load

BUNDLE = Path(__file__).resolve().parents[2] / "examples" / "modelserver"


def argvs(bundle: Path = BUNDLE, service: str = "model") -> tuple[list[str], list[str]]:
    """(service argv, runner argv) of the module at ``bundle``."""
    manifest = load(bundle)
    return (expand_exec(list(manifest.service(service).exec), bundle),
            expand_exec(list(manifest.runner.exec), bundle))


def with_python(argv: list[str], python: str) -> list[str]:
    """``argv`` run by ``python`` instead of this interpreter (its options kept)."""
    return [python, *argv[1:]]


class Service:
    """One started service of the module: its node dirs, channel and process group.
    ``features``: what its ops are offered in OARBANK_ENDPOINT_FEATURES (none by default)."""

    def __init__(self, settings: dict, argv: list[str] | None = None, bundle: Path = BUNDLE,
                 module_id: str | None = None, name: str = "model",
                 features: str | None = None) -> None:
        self.argv = argv if argv is not None else argvs(bundle, name)[0]
        self.bundle = bundle
        self.name = name
        self.features = features
        self.node = host.NodeDirs(module_id or load(bundle).id, settings)
        self.channel = host.Channel()
        self.pgid: int | None = None

    def _env(self) -> dict[str, str]:
        env = host.op_env(self.node, self.name)
        if self.features is not None:
            env["OARBANK_ENDPOINT_FEATURES"] = self.features
        return env

    def op(self, name: str, timeout_s: float = 10.0) -> host.OpResult:
        return host.run_op(self.argv, name, self._env(), self.bundle, timeout_s)

    def start(self, output_prefix: Path | None = None) -> host.OpResult:
        """``output_prefix``: keep start's stdout/stderr (which the daemon inherits) as
        ``<prefix>.out``/``.err``."""
        env = self._env()
        env["OARBANK_ENDPOINT_CHANNEL"] = self.channel.env_value
        r = host.run_op(self.argv, "start", env, self.bundle, 10,
                        inherit=(self.channel.child_fd,), output_prefix=output_prefix)
        self.channel.close_child_end()
        self.pgid = r.pid
        return r

    def wait_ready(self, timeout_s: float = 10.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            doc = self.op("ready").doc
            if (doc and doc.get("ready")) or time.monotonic() > deadline:
                return doc or {}
            time.sleep(0.05)

    def hand(self, attempt: str = "att-1") -> socket.socket:
        ours, theirs = socket.socketpair()
        self.channel.hand(attempt, theirs)
        ours.settimeout(10)
        return ours

    def loads(self) -> list[str]:
        path = self.node.data / f"{self.name}.loads"
        return path.read_text().split() if path.exists() else []

    def cleanup(self) -> None:
        self.channel.close()
        if self.pgid is not None:
            host.end_group(self.pgid, grace_s=1)
        self.node.cleanup()


class EndpointHTTP(http.client.HTTPConnection):
    """http.client over a connection the test handed the service."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__("model", timeout=10)
        self._handed = sock

    def connect(self) -> None:
        self.sock = self._handed


def post(conn: http.client.HTTPConnection, path: str, body: bytes, method: str = "POST"):
    conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())


def run_job(svc: Service, payload: object, attempt: str = "att-job", connector: bool = True,
            runner_argv: list[str] | None = None, stage: str = "generate") -> host.Attempt:
    """One attempt of the runner against ``svc``, with a connector to it unless not
    ``connector``; the connector closed and ``ended`` sent afterwards."""
    argv = runner_argv if runner_argv is not None else argvs(svc.bundle, svc.name)[1]
    conns = {svc.name: host.Connector(attempt, svc.channel)} if connector else {}
    try:
        return host.run_runner(argv, svc.node, attempt, stage, payload, {svc.name: 1},
                               conns, svc.bundle, timeout_s=60)
    finally:
        for c in conns.values():
            c.close()
        svc.channel.ended(attempt)
