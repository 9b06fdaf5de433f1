"""The `vm:<release>` backend: each node is a QEMU VM booting Debian's own kernel (bookworm:
6.1, Landlock ABI 2) with systemd as init, the agent run by the project's systemd unit.

The node's disks are built locally and cached (harness.nodes.vm.disk). The VM has no network
device: the harness reaches it over two virtio serial ports (harness.nodes.vm.guest, .channel),
one for commands and files, one carrying the agent's connections to the portal on the host.
The agent runs as the unit says (user `oarbank`, state in /var/lib/oarbank-agent, hardening);
the harness gives its flags in a drop-in that replaces the unit's ExecStart, and its
commands (`status`, `submit`, `protect`) run as the agent's user. The node's modules,
settings and portal token are copied into /node; files the scenarios read from the state
dir are copied back into the node's folder on the host when asked for (`find_files`).

Under systemd, the unit decides what happens around the agent: `kill -9` of the agent makes
systemd end what is left of the unit's cgroup (KillMode=mixed) and restart it after 5 s
(Restart=on-failure), and stopping is `systemctl stop` (SIGTERM to the agent alone).
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.nodes.backends.base import Backend, CliResult, Node, NodeError, copy_modules
from harness.nodes.procs import ProcInfo
from harness.nodes.vm import qemu
from harness.nodes.vm.channel import ChannelError
from harness.nodes.vm.disk import (
    AGENT_EXE,
    AGENT_UNIT,
    AGENT_USER,
    LOG_FILE,
    NODE_DIR,
    STATE_DIR,
    NodeDisks,
    ensure_disks,
)
from harness.nodes.vm.machine import Machine

__all__ = ["VmBackend", "VmNode", "VM_RELEASES", "exec_start", "drop_in", "node_path",
           "exit_code"]

VM_RELEASES = ("bookworm",)
DROP_IN = f"/etc/systemd/system/{AGENT_UNIT}.d/harness.conf"
# --keep-services: the project's drop-in, installed as agent/README.md says (KillMode=process).
KEEP_DROP_IN = f"/etc/systemd/system/{AGENT_UNIT}.d/keep-services.conf"
KEEP_CONF = Path(__file__).resolve().parents[3] / "agent" / "systemd" / "keep-services.conf"
CGROUP = f"/system.slice/{AGENT_UNIT}"
START_WAIT_S = 300.0  # the agent's start under TCG (its sandbox probe, Python's imports)
# Between two `status` calls: each is an interpreter start and the agent's imports, seconds of
# emulated CPU; polled back to back they would starve the agent's own ops, whose timeouts are
# the contract's (fingerprint 5 s).
STATUS_GAP_S = 2.0


def exec_start(argv: list[str]) -> str:
    """A systemd ExecStart= value running `oarbank-agent <argv>` with the node's config
    file. Each word double-quoted, with systemd's escapes (backslash, quote) and specifiers
    (`%`) and variables (`$`) doubled so that nothing is expanded."""
    words = [AGENT_EXE, argv[0], "--config", "/etc/oarbank/agent.toml", *argv[1:]]
    out = []
    for w in words:
        if any(c in w for c in "\n\r\0"):
            raise ValueError(f"an agent flag cannot hold a line break or NUL: {w!r}")
        esc = w.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
        out.append(f'"{esc}"')
    return " ".join(out)


def drop_in(argv: list[str]) -> str:
    """The unit's drop-in for one agent start: the first empty ExecStart= clears the unit's."""
    return f"[Service]\nExecStart=\nExecStart={exec_start(argv)}\n"


def node_path(root: Path, path: Path) -> str:
    """Where the agent in the VM sees a host path under the node's folder: the state dir is
    the unit's StateDirectory, everything else is copied under /node."""
    rel = path.resolve().relative_to(root.resolve()).parts
    if rel[:1] == ("state",):
        return "/".join((STATE_DIR, *rel[1:]))
    return "/".join((NODE_DIR, *rel))


def exit_code(props: dict[str, str]) -> int | None:
    """The main process's exit status from `systemctl show` (ExecMainCode 1: exited with
    ExecMainStatus; 2 or 3: killed or dumped by that signal, given negative as Popen does)."""
    code, status = props.get("ExecMainCode", ""), props.get("ExecMainStatus", "")
    if not status.lstrip("-").isdigit():
        return None
    if code == "1":
        return int(status)
    if code in ("2", "3"):
        return -int(status)
    return None


def _show(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@dataclass
class VmNode(Node):
    supervisor: ClassVar[str | None] = "systemd"
    base_config: ClassVar[str] = f'log_file = "{LOG_FILE}"\n'
    machine: Machine | None = field(default=None, repr=False)
    main_pid: int = 0  # the agent this node started (systemd's MainPID then)
    _verb: str = "start"  # how systemctl brings the agent up: start, or restart
    _status_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _status_end: float = 0.0

    # --- the guest ----------------------------------------------------------------------

    def _control(self) -> Any:
        if self.machine is None or self.machine.control is None:
            raise NodeError(f"{self.node_id}: the VM is not running")
        return self.machine.control

    def _run(self, argv: list[str], timeout_s: float = 60.0) -> CliResult:
        try:
            rc, out, err = self._control().run(argv, timeout_s)
        except ChannelError as exc:
            raise NodeError(f"{self.node_id}: {exc}") from exc
        return CliResult(rc, out, err)

    def _systemctl(self, *args: str) -> CliResult:
        return self._run(["systemctl", *args], 120)

    def _unit(self) -> dict[str, str]:
        r = self._systemctl("show", "-p", "MainPID,ExecMainPID,ExecMainCode,ExecMainStatus,"
                            "ActiveState,SubState,NRestarts", AGENT_UNIT)
        return _show(r.stdout)

    def push(self, path: Path, *, mode: int = 0o644, owner: str | None = None) -> None:
        """Copy a host file under the node's folder to where the agent sees it."""
        self._control().write(node_path(self.root, path), path.read_bytes(), mode=mode,
                              owner=owner)

    def push_tree(self, folder: Path) -> None:
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                self.push(f, mode=0o755 if f.stat().st_mode & 0o111 else 0o644)

    # --- Node ---------------------------------------------------------------------------

    def host_to_node(self, path: Path) -> str:
        return node_path(self.root, path)

    def start_agent(self, *flags: str, wait_s: float = START_WAIT_S) -> None:
        super().start_agent(*flags, wait_s=max(wait_s, START_WAIT_S))

    def _spawn_agent(self, argv: list[str]) -> None:
        for f in sorted((self.root / "settings").glob("*.json")):
            self.push(f)
        token = self.root / "portal.token"
        if token.is_file():
            self.push(token, mode=0o600, owner=AGENT_USER)  # the unit's user's, 0600
        self._control().write(DROP_IN, drop_in(argv).encode())
        if "--keep-services" in argv:
            self._control().write(KEEP_DROP_IN, KEEP_CONF.read_bytes())
        else:
            self._run(["rm", "-f", KEEP_DROP_IN])
        # Enabled as the agent README does: multi-user.target then wants it, so systemd keeps
        # the unit loaded after it stops, with its main process's exit status.
        for args in (("enable", "--no-reload", AGENT_UNIT), ("daemon-reload",)):
            r = self._systemctl(*args)
            if r.rc != 0:
                raise NodeError(f"{self.node_id}: systemctl {' '.join(args)}: {r}")
        r = self._systemctl(self._verb, AGENT_UNIT)
        if r.rc != 0:
            props = self._unit()
            if props.get("ExecMainPID", "0") != "0" and props.get("MainPID") == "0":
                # Type=notify: `systemctl start` waits for READY=1, so an agent that exits on
                # start fails the start itself; said as every backend says it.
                raise NodeError(f"{self.node_id}: the agent exited ({exit_code(props)}) on "
                                f"start: {self.log_tail()}")
            raise NodeError(f"{self.node_id}: systemctl {self._verb} {AGENT_UNIT}: {r}; "
                            f"{self.log_tail()}")
        pid = self._unit().get("MainPID", "0")
        self.main_pid = int(pid) if pid.isdigit() else 0

    def restart_agent(self, *flags: str) -> int | None:
        """`systemctl restart` with the new flags: what a package upgrade does (the unit's
        descriptor store is kept across it). None: the stopped agent's exit status is not
        what `systemctl show` says after the restart (the new agent's is)."""
        self._verb = "restart"
        try:
            self.start_agent(*flags)
        finally:
            self._verb = "start"
        return None

    def install_agent(self, version: str) -> str | None:
        """This checkout's agent as a wheel of ``version``, built here (pure Python, as for
        containers), copied into the node and pip-installed by root over the unit's
        /opt/oarbank/venv, as an operator's upgrade does (agent/README.md, "Upgrade"); the
        next `systemctl start` or `restart` runs it."""
        from harness.nodes.agentbuild import build_agent_wheel

        wheel = build_agent_wheel(self.root / f"agent-{version}", version)
        self.push(wheel)
        r = self._run([AGENT_EXE.rsplit("/", 1)[0] + "/python", "-m", "pip", "install",
                       "--disable-pip-version-check", "--no-input", "--no-index", "--no-deps",
                       "-q", self.host_to_node(wheel)], 600)
        if r.rc != 0:
            raise NodeError(f"{self.node_id}: installing agent {version} failed: {r}")
        return None

    def agent_alive(self) -> bool:
        if not self.main_pid or self.machine is None or not self.machine.alive():
            return False
        pid = self._unit().get("MainPID", "0")
        return pid.isdigit() and int(pid) == self.main_pid

    def agent_exit_code(self) -> int | None:
        if not self.main_pid or self.machine is None or not self.machine.alive():
            return None
        props = self._unit()
        if props.get("ExecMainPID") != str(self.main_pid) or props.get("MainPID") not in ("0",
                                                                                      None):
            return None  # still running, or systemd has started another since
        return exit_code(props)

    def signal_agent(self, sig: str) -> None:
        """TERM: `systemctl stop` (SIGTERM to the agent alone, as an operator stops it);
        KILL: SIGKILL to the agent's process alone."""
        if not self.agent_alive():
            return
        if sig == "TERM":
            r = self._systemctl("stop", "--no-block", AGENT_UNIT)
        else:
            r = self._systemctl("kill", "--kill-whom=main", f"--signal={sig}", AGENT_UNIT)
        if r.rc != 0 and self.agent_alive():
            raise NodeError(f"{self.node_id}: signalling the agent ({sig}) failed: {r}")

    def cli(self, *args: str, timeout_s: float = 120.0) -> CliResult:
        """`oarbank-agent <args>` as the agent's user (the control socket admits no other)."""
        try:
            return self._run(["setpriv", f"--reuid={AGENT_USER}", f"--regid={AGENT_USER}",
                              "--init-groups", "--", AGENT_EXE, *args], timeout_s)
        except NodeError as exc:
            return CliResult(125, "", str(exc))

    def status(self) -> dict[str, Any]:
        """`status --json`, one call at a time and STATUS_GAP_S apart (see there)."""
        with self._status_lock:
            time.sleep(max(0.0, self._status_end + STATUS_GAP_S - time.monotonic()))
            try:
                return super().status()
            finally:
                self._status_end = time.monotonic()

    def processes(self) -> list[ProcInfo]:
        """Every process of the agent's user or in the unit's cgroup (the harness's own
        commands left out); none when the VM is gone."""
        if self.machine is None or not self.machine.alive() or self.machine.control is None:
            return []
        try:
            found = self.machine.control.procs(AGENT_USER, CGROUP)
        except ChannelError:
            return []
        return [ProcInfo(int(p["pid"]), int(p["pgid"]), str(p["cmdline"])) for p in found]

    def find_files(self, name: str) -> list[Path]:
        """Files called `name` under the agent's state dir, copied to the same place under
        the node's folder here (what the scenarios read)."""
        try:
            files = self._control().find(STATE_DIR, name)
        except ChannelError as exc:
            raise NodeError(f"{self.node_id}: {exc}") from exc
        out = []
        for rel, data in files:
            dest = self.state_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
            out.append(dest)
        return sorted(out)

    def _pull_logs(self) -> None:
        """The agent's log and the unit's journal, into the node's folder."""
        if self.machine is None or self.machine.control is None or not self.machine.alive():
            return
        with contextlib.suppress(ChannelError, OSError):
            data = self.machine.control.read(LOG_FILE)
            if data is not None:
                (self.root / "agent.guest.log").write_bytes(data)
        with contextlib.suppress(ChannelError, OSError, NodeError):
            r = self._run(["journalctl", "--no-pager", "-o", "short-monotonic",
                           "-u", AGENT_UNIT], 60)
            (self.root / "journal.log").write_text(r.stdout + r.stderr)

    def log_tail(self, n: int = 2000) -> str:
        self._pull_logs()
        parts = []
        for name in ("agent.guest.log", "journal.log"):
            with contextlib.suppress(OSError):
                parts.append(f"[{name}] " + (self.root / name).read_text(errors="replace")
                             [-n:])
        return " ".join(parts) or "(no agent.log)"

    def started_note(self) -> str | None:
        if self.machine is None:
            return None
        h = self.machine.hello
        return (f"{self.node_id}: VM booted in {self.machine.boot_s:.1f} s "
                f"({self.machine.spec.accel}), kernel {h.get('kernel')}, "
                f"Landlock ABI {h.get('landlock_abi')}; agent under systemd ({AGENT_UNIT})")

    def cleanup(self) -> None:
        if self.machine is None:
            return
        self._pull_logs()
        self.machine.stop()


class VmBackend(Backend):
    def __init__(self, release: str) -> None:
        if release not in VM_RELEASES:
            raise ValueError(f"unknown VM release {release!r}; known: {', '.join(VM_RELEASES)}")
        self.release = release
        self.name = f"vm:{release}"
        self.disks: NodeDisks | None = None
        self.accel = "tcg"
        self.machines: list[Machine] = []

    @classmethod
    def unavailable(cls) -> str | None:
        return qemu.unavailable()

    def setup(self, out: Path) -> dict[str, Any]:
        t0 = time.monotonic()
        self.disks = ensure_disks(self.release)
        ready = time.monotonic() - t0
        self.accel, why = qemu.accel_for_this_boot(self.disks.kernel)
        return {"accel": self.accel, "accel_why": why, "python": self.disks.python,
                "rootfs_built_s": _round(self.disks.rootfs_built_s),
                "system_built_s": _round(self.disks.system_built_s),
                "project_built_s": _round(self.disks.project_built_s),
                "disks_ready_s": round(ready, 1)}

    def make_node(self, node_id: str, root: Path, modules: list[Path],
                  settings: dict[str, dict[str, Any]], portal: Any) -> Node:
        assert self.disks is not None
        root.mkdir(parents=True, exist_ok=True)
        copies = copy_modules(root, modules)
        machine = Machine.boot(root / "vm", self.disks, node_id, self.accel,
                               portal.socket_path if portal is not None else None)
        self.machines.append(machine)
        node = VmNode(node_id=node_id, root=root, modules=copies, settings=dict(settings),
                      portal_url="unix:/run/oarbank-harness/portal.sock" if portal else None,
                      portal_token=portal.issue_token(node_id) if portal else None,
                      machine=machine)
        try:
            for m in copies:
                node.push_tree(m)
        except Exception:
            node.cleanup()
            raise
        return node

    def teardown(self) -> None:
        for m in self.machines:
            with contextlib.suppress(Exception):
                m.stop()
        self.machines.clear()

    def leftovers(self) -> list[str]:
        """A QEMU still running, or an overlay disk or socket still there."""
        left = []
        for m in self.machines:
            if m.alive():
                left.append(f"qemu pid {m.proc.pid if m.proc else '?'} ({m.spec.hostname})")
            left += [f"file {f}" for f in (m.spec.system_disk, m.spec.project_disk,
                                           m.spec.control_socket, m.spec.portal_socket)
                     if f.exists()]
        self.machines = [m for m in self.machines if m.alive()]
        return left


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)
