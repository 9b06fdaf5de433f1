"""A minimal, synchronous agent for the conformance kit (and for tests that play the agent).

It does what the agent does to one module, and nothing more (contract sections 2 to 4):

- ``NodeDirs``: a throw-away node: the module data dir (HOME and TMPDIR inside it), the
  settings, limits and tools files;
- ``op_env`` / ``run_op``: the exact op environment, each op in its own process group, its
  stdout's last JSON line as the answer;
- ``Channel``: the agent end of an endpoint channel: waits for the hello, hands connections
  (``connection`` + descriptor, kept until ``accepted``), sends ``ended``;
- ``Connector``: the agent end of one attempt's connector: answers each ``connect`` with a new
  socketpair, one end to the service over the channel, the other to the job (kept until
  ``received``); ``bad_request`` for anything else, ``service_unavailable`` when the channel
  is not up.

Threads are fine here (unlike in the agent, which runs one event loop): each Channel and
Connector has one reader thread; sends are serialised by a lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from oarbank_sdk import _transport, advice, environments
from oarbank_sdk._opdoc import last_json_object
from oarbank_sdk._wire import (
    Accepted,
    Connect,
    Hello,
    LineSplitter,
    Ok,
    Ready,
    Received,
    Refusal,
    WireError,
    decode,
    encode,
    parse_from_job,
    parse_from_service,
)
from oarbank_sdk.manifest import platform_token

__all__ = [
    "NodeDirs",
    "OpResult",
    "platform_token",
    "wire_attempt",
    "op_env",
    "run_op",
    "group_pids",
    "end_group",
    "Channel",
    "Connector",
    "Attempt",
    "runner_env",
    "run_runner",
]


class NodeDirs:
    """A temporary node for one module: removed by ``cleanup``."""

    def __init__(self, module_id: str, settings: dict | None = None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="oarbank-conform-"))
        self.module_id = module_id
        self.data = self.root / "modules" / module_id
        self.home = self.data / "home"
        self.tmp = self.data / "tmp"
        for d in (self.home, self.tmp):
            d.mkdir(parents=True)
        self.settings_file = self.root / "settings.json"
        self.limits_file = self.root / "limits.json"
        self.tools_file = self.root / "tools.json"
        self.settings_file.write_text(json.dumps(settings or {}))
        self.limits_file.write_text("{}")
        self.tools_file.write_text("{}")
        self.node_id = "conform-" + (platform.node() or "node")

    def attempt_dir(self, attempt_id: str) -> Path:
        w = self.root / "attempts" / attempt_id
        (w / "tmp").mkdir(parents=True)
        (w / "home").mkdir()
        return w

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def op_env(node: NodeDirs, service: str) -> dict[str, str]:
    """The environment of every service op (contract section 2): these and nothing else."""
    return environments.op_env(
        module=node.module_id, service=service, node_id=node.node_id, platform=platform_token(),
        data_dir=node.data, settings_file=node.settings_file, limits_file=node.limits_file,
        tools_file=node.tools_file)


@dataclass
class OpResult:
    op: str
    pid: int  # also the process group id: each op runs in its own group
    rc: int | None  # None: timed out (the group was killed)
    doc: dict | None  # the last stdout line that parses as a JSON object
    stdout: str
    stderr: str
    elapsed_s: float

    @property
    def timed_out(self) -> bool:
        return self.rc is None

    def tail(self, n: int = 300) -> str:
        """The end of stderr (or stdout), for a failure line."""
        text = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        return text[-n:]


def _output_file(prefix: Path | None, suffix: str):
    if prefix is None:
        return tempfile.TemporaryFile()
    return open(f"{prefix}{suffix}", "w+b")  # noqa: SIM115 (returned as a context manager)


def run_op(
    argv: list[str],
    op: str,
    env: dict[str, str],
    cwd: str | Path,
    timeout_s: float,
    inherit: tuple[int, ...] = (),
    kill_group_on_timeout: bool = True,
    output_prefix: Path | None = None,
) -> OpResult:
    """Run ``argv + [op]`` in a new process group; wait for the op itself (not for what it
    leaves running). stdout/stderr go to files, not pipes: a daemon that inherits them must
    not keep us waiting for an end of file. With ``output_prefix`` the files are kept as
    ``<prefix>.out`` / ``<prefix>.err`` (what a daemon writes there later can be read too).
    ``inherit``: the handles the op gets (passed the transport's way)."""
    with _output_file(output_prefix, ".out") as out, _output_file(output_prefix, ".err") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [*argv, op],
            cwd=str(cwd),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group (and session), like the agent
            **_transport.current().inheritable_kwargs(*inherit),
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
            if kill_group_on_timeout:
                end_group(proc.pid, grace_s=0)
            proc.kill()
            proc.wait()
        elapsed = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    return OpResult(op, proc.pid, rc, last_json_object(stdout), stdout, stderr, elapsed)


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    found = []
    for p in psutil.process_iter(["status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(p.pid) == pgid:
                found.append(p.pid)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return found


def end_group(pgid: int, grace_s: float = 2.0) -> list[int]:
    """SIGTERM the group, wait up to ``grace_s``, then SIGKILL what is left. Returns the pids
    that had to be killed."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = group_pids(pgid)
    if left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while group_pids(pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
    return left


def _sendall(t: _transport.Transport, sock: socket.socket, data: bytes, attach: int | None) -> None:
    """Send a whole message; the descriptor rides with its first byte."""
    sent = t.send(sock, data, attach=attach)
    while sent < len(data):
        sent += t.send(sock, data[sent:])


class _Reader:
    """A thread reading line messages from one socket; descriptors a peer attaches to its own
    messages are closed, never used (contract section 3)."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        self.sock = sock
        self.t = _transport.current()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        splitter = LineSplitter()
        while True:
            try:
                data, fds = self.t.recv(self.sock, 65536)
            except OSError as exc:
                self.on_eof(f"read failed: {exc}")
                return
            for fd in fds:
                os.close(fd)
            if not data:
                self.on_eof("end of file")
                return
            try:
                lines = splitter.feed(data)
            except WireError as exc:
                self.on_bad_line(exc)
                continue
            for line in lines:
                try:
                    self.on_message(decode(line))
                except WireError as exc:
                    self.on_bad_line(exc)

    def on_message(self, msg: dict) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def on_bad_line(self, exc: WireError) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def on_eof(self, why: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class _AgentEnd(_Reader):
    """The agent's end of a socketpair whose other end (``child_fd``) a child inherits.

    Ends handed to the peer are kept in ``_pending`` (conn -> our copy) until its receipt;
    ``close`` closes them with the socket."""

    def __init__(self, name: str) -> None:
        agent_end, child_end = _transport.current().pair()
        super().__init__(agent_end, name)
        self.child_fd: int | None = child_end.detach()
        self._lock = threading.Lock()
        self._pending: dict[int, socket.socket] = {}  # conn -> our copy, until the receipt
        self._next_conn = 1
        self._closing = False

    @property
    def env_value(self) -> str:
        assert self.child_fd is not None
        return self.t.format(self.child_fd)

    def close_child_end(self) -> None:
        """After the child was spawned: only the child holds its end now."""
        if self.child_fd is not None:
            os.close(self.child_fd)
            self.child_fd = None

    def close(self) -> None:
        """The agent closes its end: the peer sees end of file."""
        self._closing = True
        self.close_child_end()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.join()
        self.sock.close()
        with self._lock:
            for copy in self._pending.values():
                copy.close()
            self._pending.clear()


class Channel(_AgentEnd):
    """The agent's end of one endpoint channel. ``child_fd`` goes to ``start``; ``close`` is
    stop order step 2 (the service sees end of file)."""

    def __init__(self) -> None:
        super().__init__("conform-channel")
        self._hello = threading.Event()
        self.hello_pid: int | None = None
        # {"op": "ready"} (the `ready` feature the kit offers, as an agent does); also set at
        # the service's EOF, to wake a waiter: check ``said_ready``.
        self.ready_event = threading.Event()
        self.said_ready = False
        self.closed_reason: str | None = None  # set when the SERVICE closed or broke it
        self.problems: list[str] = []  # protocol violations by the service
        self.handed = 0
        self.start()

    @property
    def is_open(self) -> bool:
        return self.closed_reason is None and not self._closing

    def wait_hello(self, timeout_s: float) -> int | None:
        self._hello.wait(max(0.0, timeout_s))
        return self.hello_pid

    def on_message(self, msg: dict) -> None:
        try:
            parsed = parse_from_service(msg)
        except WireError as exc:
            self.on_bad_line(exc)
            return
        if isinstance(parsed, Hello):
            if self.hello_pid is not None:
                self.problems.append(f"a second hello (pid {parsed.pid}); hello comes exactly once")
                return
            self.hello_pid = parsed.pid  # state: channel up, connections may be handed
            self._hello.set()
        elif isinstance(parsed, Ready):
            if self.hello_pid is None:
                self.problems.append("'ready' before hello; hello must come first")
            elif self.said_ready:
                self.problems.append("a second 'ready'; it is said at most once")
            else:
                self.said_ready = True  # state: the service says it can serve
                self.ready_event.set()
        elif isinstance(parsed, Accepted):
            if self.hello_pid is None:
                self.problems.append("'accepted' before hello; hello must come first")
            with self._lock:
                copy = self._pending.pop(parsed.conn, None)
            if copy is None:
                self.problems.append(f"'accepted' for conn {parsed.conn}, which was never handed")
            else:
                copy.close()  # receipt: the service holds its end, ours can go

    def on_bad_line(self, exc: WireError) -> None:
        self.problems.append(f"malformed message on the channel: {exc.detail}")

    def on_eof(self, why: str) -> None:
        if not self._closing:
            # state: the service closed its channel (a service failure per the contract)
            self.closed_reason = advice.channel_closed(why)
        self._hello.set()  # wake a waiter: no hello will come now
        self.ready_event.set()  # nor a `ready`

    def hand(self, attempt: str, service_end: socket.socket) -> int:
        """Send ``service_end`` to the service as a connection of ``attempt`` (named here;
        the service sees its integer wire id, as from an agent). Takes ownership of
        ``service_end`` (kept until the service's receipt)."""
        with self._lock:
            conn = self._next_conn
            self._next_conn += 1
            self._pending[conn] = service_end
            data = encode({"op": "connection", "conn": conn, "attempt": wire_attempt(attempt)})
            _sendall(self.t, self.sock, data, service_end.fileno())
            self.handed += 1
        return conn

    def ended(self, attempt: str) -> None:
        with self._lock:
            _sendall(self.t, self.sock, encode({"op": "ended", "attempt": wire_attempt(attempt)}),
                     None)

    def pending_receipts(self) -> int:
        with self._lock:
            return len(self._pending)


# Attempt names -> the integers services see on the channel (contract section 3: agents send
# integers, and a service built on upstream's SDK does int(msg["attempt"])). One counter per
# process, never reused, like an agent's.
_wire_lock = threading.Lock()
_wire_ids: dict[str, int] = {}


def wire_attempt(attempt: str) -> int:
    """The integer id of the attempt named ``attempt`` on every channel of this process."""
    with _wire_lock:
        return _wire_ids.setdefault(attempt, len(_wire_ids) + 1)


class Connector(_AgentEnd):
    """The agent's end of one attempt's connector to one service's channel. Job ends handed
    over wait in ``_pending`` until the job's ``received``."""

    def __init__(self, attempt: str, channel: Channel) -> None:
        super().__init__(f"conform-connector-{attempt}")
        self.attempt = attempt
        self.channel = channel
        self.connects = 0
        self.refusals: list[str] = []
        self.problems: list[str] = []
        self.start()

    def _reply(self, msg: dict, attach: int | None = None) -> None:
        with contextlib.suppress(OSError):
            _sendall(self.t, self.sock, encode(msg), attach)

    def _refuse(self, code: str, detail: str) -> None:
        self.refusals.append(f"{code}: {detail}")
        self._reply(Refusal(code, detail).to_wire())

    def on_message(self, msg: dict) -> None:
        try:
            parsed = parse_from_job(msg)
        except WireError as exc:
            self.on_bad_line(exc)
            return
        if isinstance(parsed, Received):
            with self._lock:
                copy = self._pending.pop(parsed.conn, None)
            if copy is None:
                self.problems.append(f"'received' for conn {parsed.conn}, which was never sent")
            else:
                copy.close()
            return
        assert isinstance(parsed, Connect)
        if not (self.channel.is_open and self.channel.hello_pid is not None):
            why = self.channel.closed_reason or "the service has not said hello"
            self._refuse("service_unavailable", f"the service is not ready: {why}")
            return
        job_end, service_end = self.t.pair()
        try:
            self.channel.hand(self.attempt, service_end)
        except OSError as exc:
            job_end.close()
            self._refuse("service_unavailable", f"handing the connection failed: {exc}")
            return
        with self._lock:
            conn = self._next_conn
            self._next_conn += 1
            self._pending[conn] = job_end
            self.connects += 1
        self._reply(Ok(conn).to_wire(), attach=job_end.fileno())

    def on_bad_line(self, exc: WireError) -> None:
        self.problems.append(exc.detail)
        self._refuse("bad_request", exc.detail)

    def on_eof(self, why: str) -> None:
        pass  # the job closed its connector (or exited): nothing more to answer


@dataclass
class Attempt:
    """What the runner of one attempt leaves behind."""

    attempt_id: str
    workdir: Path
    rc: int | None
    result: dict | None = None
    failure: dict | None = None
    stderr: str = ""
    connects: int = 0
    refusals: list[str] = field(default_factory=list)


def runner_env(
    node: NodeDirs,
    attempt_id: str,
    workdir: Path,
    pools: dict[str, int],
    connectors: dict[str, Connector],
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The runner's environment (contract section 4): these and nothing else, plus the
    manifest's ``[runner].env``."""
    return environments.runner_env(
        module=node.module_id, attempt_id=attempt_id, workdir=workdir, data_dir=node.data,
        platform=platform_token(), settings_file=node.settings_file, pools=pools,
        manifest_env=extra, connectors={s: c.env_value for s, c in connectors.items()})


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def run_runner(
    argv: list[str],
    node: NodeDirs,
    attempt_id: str,
    stage: str,
    payload: object,
    pools: dict[str, int],
    connectors: dict[str, Connector],
    cwd: str | Path,
    timeout_s: float,
    extra_env: dict[str, str] | None = None,
    grace_s: float = 2.0,
) -> Attempt:
    """One attempt: spec.json, the runner in its own process group with the connectors
    inherited, wait (``timeout_s``), end the group, collect result.json / failure.json.
    The caller closes the connectors and sends ``ended``."""
    w = node.attempt_dir(attempt_id)
    spec = {"job_id": f"job-{attempt_id}", "attempt_id": attempt_id, "stage": stage,
            "payload": payload}
    (w / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    env = runner_env(node, attempt_id, w, pools, connectors, extra_env)
    fds = tuple(c.child_fd for c in connectors.values() if c.child_fd is not None)
    cmd = [*argv, "run", "--spec", str(w / "spec.json"), "--workdir", str(w),
           "--out", str(w / "result.json")]
    with open(w / "runner.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True,
                                **_transport.current().inheritable_kwargs(*fds))
    for c in connectors.values():
        c.close_child_end()  # only the runner holds them now
    try:
        rc: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        rc = None
    end_group(proc.pid, grace_s=grace_s)  # the attempt is over: nothing of it may stay
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    stderr = (w / "runner.log").read_text(encoding="utf-8", errors="replace")
    return Attempt(
        attempt_id, w, rc,
        result=_read_json(w / "result.json") if rc == 0 else None,
        failure=_read_json(w / "failure.json"),
        stderr=stderr,
        connects=sum(c.connects for c in connectors.values()),
        refusals=[r for c in connectors.values() for r in c.refusals],
    )
