"""The platform interface: what every backend gives the rest of the agent, and nothing more.

One ``Backend`` per process (``platform.current()``), made of parts, each a small protocol
below. A part says what it does in the agent's words (a group is ended, a request to stop
arrives), never how an OS does it; a port writes its backend and touches nothing else.

Parts (each section below): process groups (``Groups``, ``Group``), memory and CPU limits,
the sandbox wrapper and its probe, the control endpoint, the state-dir lock, stop and reload
requests, the event loop, the stream type behind the transport, connections by duplication;
the keeper's socket and the service manager (``--keep-services``) are in ``keepapi.py``, the
runners' fate sharing with the agent and their control nudges in ``fateapi.py``."""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar

from oarbank_agent.platform.fateapi import Nudges, Tether, TetherHost
from oarbank_agent.platform.keepapi import KeeperHost, ServiceManager

if TYPE_CHECKING:
    import asyncio
    import socket
    from collections.abc import Coroutine
    from pathlib import Path

__all__ = ["Backend", "FactoryLost", "FileLike", "Watchable", "Watcher", "Streams", "EndpointPathTooLong",
           "ClientHandler", "Endpoint", "StateDirHost", "StateDirRefused", "Requests", "Loops", "FactoryHost",
           "SandboxHost", "Tether", "TetherHost", "Nudges",
           "CONTAINMENT_MODES", "CONTAINMENT_HELP", "ContainmentUnavailable", "Group", "Slot",
           "PopenOptions", "Containment", "Groups", "KeeperHost", "ServiceManager", "Handovers"]


# -- the sandbox wrapper and its probe ----------------------------------------------------------
# The launcher itself is the SDK's (``oarbank_sdk.sandbox``: Landlock and seccomp on Linux,
# Seatbelt on macOS); the backend says which of its measured walls this system needs, and
# keeps the agent's own memory from its children.


class SandboxHost(Protocol):
    """What confining children means on this system."""

    # Measured capabilities that together make a child's only connections the agent's.
    endpoint_walls: tuple[str, ...]
    # Every wall ``--sandbox required`` refuses to start without.
    required_walls: tuple[str, ...]
    # Walls whose absence is warned about, never refused (belt and braces).
    extra_walls: tuple[str, ...]

    def unavailable_reason(self) -> str | None:
        """Why the SDK's launcher cannot confine a child on this system at all, or None."""

    def set_undumpable(self) -> bool:
        """Keep the agent's memory and environment from non-root readers; True if it took."""

    def undumpable(self) -> bool:
        """Whether the agent is undumpable now."""

    def kernel_note(self) -> str | None:
        """One line on the kernel's sandbox features for the log (e.g. the Landlock ABI)."""

    def walls(self) -> dict[str, str]:
        """The walls this system measures itself, each ``enforced`` or why not (Windows: its
        job objects'); empty where the SDK's launcher measures them (Linux, macOS)."""

# -- the stream type behind the transport, and readiness I/O -------------------------------------
# The agent's streams (a broker connection, a service's log pipe, the factory's socket) are
# watched on the event loop: "call me when it is readable / writable", "stop watching".


class FileLike(Protocol):
    def fileno(self) -> int: ...


# What a watcher watches: a stream object (the transport's, a socket on POSIX) or a
# descriptor the backend made (``Streams.pipe``).
Watchable = int | FileLike


class Watcher(Protocol):
    """Readiness on one event loop. One callback per stream and direction; watching again
    replaces it."""

    def on_readable(self, stream: Watchable, callback: Callable[..., object],
                    *args: Any) -> None:
        """Call ``callback(*args)`` each time ``stream`` has something to read (or EOF)."""

    def on_writable(self, stream: Watchable, callback: Callable[..., object],
                    *args: Any) -> None:
        """Call ``callback(*args)`` each time ``stream`` takes more bytes."""

    def off_readable(self, stream: Watchable) -> bool:
        """Stop watching ``stream`` for reading; False if it was not watched."""

    def off_writable(self, stream: Watchable) -> bool:
        """Stop watching ``stream`` for writing; False if it was not watched."""


class Streams(Protocol):
    """The stream type behind the transport, and how the agent waits on streams."""

    @property
    def kind(self) -> type:
        """What ``oarbank_sdk.protocol``'s transport hands the agent (a socket on POSIX)."""

    def watcher(self, loop: asyncio.AbstractEventLoop) -> Watcher:
        """Readiness on ``loop`` (the agent's loop, ``Loops.new``)."""

    def child_pair(self) -> tuple[Any, Any]:
        """A connected stream pair ``(ours, theirs)`` for a channel or connector: ours watched
        on the agent's loop, theirs made inheritable for one child (passed with the
        transport's ``inheritable_kwargs``; the caller closes it once the child runs)."""

    def pipe(self) -> tuple[int, int]:
        """A new pipe ``(read end, write end)``, neither inherited by children unless passed
        on explicitly: the write end a descriptor for a child's stdout or stderr
        (``os.close`` it once the child has it), the read end the agent's, watched for
        reading, read with ``read_some`` and closed with ``close_read_end``."""

    def read_some(self, end: int, size: int) -> bytes | None:
        """Up to ``size`` bytes from the read end of a ``pipe``: ``b""`` at end of file, None
        when nothing waits now (it never blocks). Raises OSError."""

    def close_read_end(self, end: int) -> None:
        """Close the read end of a ``pipe``."""


# -- how a connection's ends reach the job and the service --------------------------------------
# POSIX: they ride along the ``ok`` and ``connection`` messages (SCM_RIGHTS), and the backend
# has no part for it (``Backend.handovers`` is None). Windows: nothing rides along a pipe; each
# end is duplicated into the process that gets it and named in the message (``"handle"``).


class Handovers(Protocol):
    """Connections made by duplicating each end into its receiver (contract section 3)."""

    def duplicate(self, job_pid: int, service_pid: int) -> tuple[Any, Any, int, int]:
        """A new connection between ``job_pid`` and ``service_pid`` (the broker has checked
        that each is a process of the attempt or the service): ``(job end, service end)``, the
        agent's copies, kept until the receipts, then the handle values in the job and in the
        service. Raises OSError when a duplication fails (a process gone); nothing is left in
        either process then."""


# -- the control endpoint ------------------------------------------------------------------------


class EndpointPathTooLong(OSError):
    """The endpoint's path cannot be used on this system (the message names it and the limit)."""


ClientHandler = Callable[["asyncio.StreamReader", "asyncio.StreamWriter"], "Awaitable[None]"]


class Endpoint(Protocol):
    """``<state>/control.sock``: served by the agent, open to its own user only."""

    def check(self, path: Path) -> None:
        """Raise ``EndpointPathTooLong`` if ``path`` can never be served or reached (asked
        before anything starts; the folder need not exist yet)."""

    async def serve(self, path: Path, on_client: ClientHandler, *,
                    limit: int) -> asyncio.AbstractServer:
        """Serve ``path`` (a stale endpoint there is replaced), owner-only from the first
        moment; ``limit``: the longest line a reader takes."""

    def connect(self, path: Path, timeout: float | None) -> socket.socket:
        """A blocking connection to the endpoint at ``path`` (``timeout`` for every call on
        it). Raises FileNotFoundError or ConnectionRefusedError when nothing serves there,
        PermissionError when it is not ours, EndpointPathTooLong."""

    async def open(self, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A stream connection to a local socket path (the heartbeat's ``http+unix`` URL)."""


# -- the state-dir lock --------------------------------------------------------------------------


class StateDirRefused(Exception):
    """A state dir (or its lock file) this agent must not use: another user's, not a folder,
    not to be made (the message says which, naming the path)."""


class StateDirHost(Protocol):
    """What keeping a state dir private and single-agent needs of the system."""

    def claim(self, path: Path) -> None:
        """Make ``path`` this user's alone: a missing folder is made so (its parents as
        usual), an existing one of this user's is tightened; raises ``StateDirRefused`` for
        what is another user's or not a folder, or cannot be made."""

    def open_private(self, path: Path) -> int:
        """``path`` (a file in a claimed folder) opened read-write, made if missing, for this
        user only, never through a link; a descriptor, not inherited. Raises
        ``StateDirRefused``."""

    def others_may_read(self, path: Path, fd: int) -> str | None:
        """Why a secret open as ``fd`` (``path``: for the message) can be read by others than
        this user (and who can read anything anyway), with how to fix it; None when it
        cannot. Raises OSError where the system will not say."""

    def try_lock(self, fd: int) -> bool:
        """Lock the open file ``fd`` for this process: True if taken, False if another
        process holds it. The lock goes when ``fd`` is closed or the process dies. Other
        failures raise OSError."""

    def user_name(self, uid: int) -> str | None:
        """The login name of ``uid``, None if it has none."""

    def umask(self) -> int:
        """This process's file mode creation mask, read without changing it (threads may
        create files meanwhile)."""


# -- stop and reload requests --------------------------------------------------------------------


class Requests(Protocol):
    """How an operator asks a running agent to stop or to reload (besides the control
    endpoint's ``drain`` and ``reload``)."""

    stop_how: str  # for help texts: what an operator sends to stop the agent (Ctrl-C does too)
    reload_how: str  # for help texts: what an operator sends to make it reload

    def install(self, loop: asyncio.AbstractEventLoop, on_stop: Callable[[str], None],
                on_reload: Callable[[str], None]) -> None:
        """From now on, a stop request calls ``on_stop(why)`` and a reload request calls
        ``on_reload(why)`` on ``loop``; ``why`` names the request for the log."""


# -- the event loop ------------------------------------------------------------------------------

T = TypeVar("T")


class Loops(Protocol):
    """The agent's event loop: one that ``Streams.watcher`` and ``Requests`` work with."""

    def new(self) -> asyncio.AbstractEventLoop:
        """A new event loop (not set as current)."""

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run ``main`` to completion on a new loop, as ``asyncio.run`` does."""


# -- the process factory's host side -------------------------------------------------------------


class FactoryLost(OSError):
    """The process factory died before it answered a spawn."""


class FactoryHost(Protocol):
    """What the agent's side of its process factory asks of the system about one process: the
    factory itself, or a child it lost when it died."""

    def footprint(self, pid: int) -> dict[str, int]:
        """What can be read of ``pid``: ``rss_bytes`` (resident memory), ``fds`` (open
        descriptors); a key is left out when it cannot be read."""

    async def until_gone(self, pid: int) -> None:
        """Return once ``pid`` (not necessarily the agent's child) has exited; a zombie counts
        as exited."""

    def client(self, *, confine: bool, backend: Backend) -> Any:
        """The agent's side of a new process factory (``start()`` it on the loop), using
        ``backend`` (this one) for its I/O; raises ``OSError`` where there is no factory."""


# -- plain subprocesses in sessions, for tools outside the agent's loop ------------------------


class Sessions(Protocol):
    """Start a plain subprocess in a session of its own, ask it to stop, end its session."""

    def start(self, argv: list[str], *, stop_with_parent: bool = False,
              **popen: Any) -> subprocess.Popen[Any]:
        """``subprocess.Popen(argv, **popen)`` in a session of its own; ``stop_with_parent``:
        stopped when its starter dies, where the system can say so."""

    def popen_options(self, *, stop_with_parent: bool = False) -> dict[str, Any]:
        """``subprocess.Popen`` keywords for a child in its own session (``start`` is what
        gives every part of one: on Windows, the job that ``kill_session`` ends)."""

    def ask_to_stop(self, proc: subprocess.Popen[Any]) -> None:
        """The polite stop (the agent drains on it)."""

    def kill_session(self, leader_pid: int) -> None:
        """End everything left in the session ``leader_pid`` leads; gone already is fine."""


# -- process groups, their limits and their containment ------------------------------------------
# Every op, service daemon and runner is the leader of a group the agent starts: the leader and
# all it starts, ended as one. What a group is made of (a POSIX process group, a cgroup around
# it on Linux, a job object on Windows) is the backend's; the agent holds ``Group`` objects,
# writes the dict ``Group.record`` gives into ``<state>/procs/`` and hands it back to
# ``Groups.restore`` after a restart.

CONTAINMENT_MODES = ("auto", "cgroup", "process-group")  # ``oarbank-agent run --containment``
CONTAINMENT_HELP = ("how an attempt's (and a service's) processes are ended: auto (default: a "
                    "cgroup each where cgroup v2 is usable, else the process group), cgroup "
                    "(refuse to start without it), process-group (on Windows every group is a "
                    "job object whatever is asked)")


class ContainmentUnavailable(Exception):
    """The containment asked for (``--containment cgroup``) cannot be had on this system."""


class Group(Protocol):
    """One group of processes the agent started or adopted (opaque; hashable, by its key)."""

    @property
    def leader(self) -> int:
        """The pid of the process the group was started for."""

    @property
    def key(self) -> str:
        """Unique among the live groups: names its record (``<state>/procs/<key>.json``)."""

    def record(self) -> dict[str, Any]:
        """What a restarted agent needs to find this group again (``Groups.restore``)."""

    def members(self) -> list[int]:
        """Its live processes, leader included while alive."""

    def pids(self, table: object | None = None) -> set[int]:
        """Every process it holds, also those that left the leader's process group where the
        backend can follow them. ``table``: one ``Groups.snapshot()`` for many groups."""

    def alive(self) -> bool:
        """Anything of it left (False for a record of another boot: its numbers mean nothing)."""

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` belongs to it."""

    def terminate(self) -> None:
        """Ask every member to stop (a handler may refuse); never raises."""

    def kill(self, *, also: int | None = None) -> None:
        """End every member now (and the process ``also``); never raises."""

    async def end(self, grace_s: float) -> bool:
        """Terminate, wait up to ``grace_s`` for it to be gone, then kill; release what held
        it. True if it had to kill. Safe on a group that is already gone."""

    async def wait_gone(self, poll_s: float = 2.0) -> None:
        """Return once it has no live member (cancellable; without an event to wait on, the
        backend looks every ``poll_s``)."""

    def oom_kills(self) -> int:
        """How many of its processes the kernel ended at its memory limit (0 without one)."""


class PopenOptions(TypedDict, total=False):
    """What starting a leader of a new group needs of ``asyncio.create_subprocess_exec``."""

    start_new_session: bool
    creationflags: int  # Windows: started suspended, then placed in its job (``started``)


class Slot(Protocol):
    """Room for the next group, made before its leader is started (``Groups.prepare``)."""

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started directly into this slot (it enters before its own code runs)."""

    def popen_kwargs(self) -> PopenOptions:
        """What ``asyncio.create_subprocess_exec`` needs for a new group."""

    def factory_kwargs(self) -> dict[str, Any]:
        """What the process factory's ``spawn`` needs to place its child here (``join``: the
        file the child writes its pid into first, or None)."""

    def started(self, leader: int) -> Group:
        """The leader runs: its group (remembered until it is ended)."""

    def abandon(self) -> None:
        """Nothing was started: release the room."""


class Containment(Protocol):
    """How far a group reaches on this machine (``status``: containment, its note)."""

    mode: str  # one of CONTAINMENT_MODES but auto; on Windows always "job-object"
    note: str  # why this mode, readable

    @property
    def base(self) -> object | None:
        """Where the groups are held (the backend's; ``resourcelimits.setup`` hands it back)."""

    @property
    def enabled(self) -> bool:
        """Whether groups are held by more than a process group here."""

    def report(self) -> dict[str, Any]:
        """For ``status``: ``containment``, ``containment_note``, ``containment_base``."""

    def close(self) -> None:
        """Agent shutdown: release what is left of it (every group is ended by then)."""


class Groups(Protocol):
    """Process groups: made, found again after a restart, limited, watched."""

    @property
    def killed_returncode(self) -> int:
        """The return code of a leader the agent killed (``Group.kill``), as ``wait`` says."""

    @property
    def can_inspect(self) -> bool:
        """Whether a member's confinement can be read (``process_status``): the escape
        check runs only then."""

    def resolve(self, mode: str, state_dir: Path) -> Containment:
        """The containment for ``mode`` here. Raises ``ContainmentUnavailable``, ValueError."""

    def install(self, containment: Containment) -> None:
        """Use ``containment`` for every group from now on (once, at start)."""

    @property
    def containment(self) -> Containment:
        """The installed containment."""

    def limit_gaps(self, base: object | None, why: str) -> dict[str, str]:
        """Make memory and CPU limits usable for the groups: controller (``memory``,
        ``cpu``) -> why it cannot be enforced, for each one that cannot."""

    def install_limits(self, missing: dict[str, str]) -> None:
        """Keep what ``limit_gaps`` found (``resourcelimits.install``)."""

    @property
    def limits_missing(self) -> dict[str, str] | None:
        """What ``install_limits`` kept; None before."""

    def prepare(self, limits: dict[str, str] | None = None) -> Slot:
        """Room for the next group, with ``limits`` (``resourcelimits.stage_limits``: only
        those ``limit_gaps`` left enforceable) set before its leader runs. Raises OSError."""

    def of(self, leader: int) -> Group:
        """The group started for ``leader`` (one this agent spawned, else a bare one)."""

    def restore(self, record: dict[str, Any]) -> Group:
        """A group from its ``record`` (a predecessor's). Raises KeyError, ValueError,
        TypeError for a torn record."""

    def adopt(self, group: Group) -> None:
        """A restored group the agent now keeps (ended as if spawned by it)."""

    async def sweep(self, keep: list[Group], grace_s: float) -> list[str]:
        """End what predecessors left that no record names (except ``keep``)."""

    def describe(self, group: Group | None) -> dict[str, Any]:
        """The group's numbers for an operator (``status`` rows, log lines)."""

    def ending(self, killed: bool, grace_s: float) -> str:
        """How a group was ended, in words (``Group.end``'s answer)."""

    def snapshot(self) -> object:
        """One read of the process table, for ``Group.pids`` of many groups."""

    def resident(self, groups: list[Group]) -> dict[Group, int]:
        """Resident bytes of each group's live members (one pass)."""

    def process_status(self, pid: int) -> dict[str, str] | None:
        """The kernel's status fields of ``pid`` (``Seccomp``, ``NoNewPrivs``, ``State``,
        ``Name``), None when gone or unknown here."""

    def cmdline(self, pid: int) -> bytes | None:
        """``pid``'s command line (NUL-separated), None when gone or unknown here."""

    def use_child_watcher(self, loop: asyncio.AbstractEventLoop) -> str:
        """Reap the agent's children on ``loop`` without a thread each where the system
        allows; the watcher in use, for the log."""


@dataclass(frozen=True)
class Backend:
    """The chosen backend: its name and its parts (fields added per part, one section each)."""

    name: str
    sandbox: SandboxHost
    sessions: Sessions
    # the control plane and the agent's I/O
    streams: Streams
    endpoint: Endpoint
    statedir: StateDirHost
    requests: Requests
    loops: Loops
    factory: FactoryHost
    # process groups, their limits and containment
    groups: Groups
    # endpoint channels kept across an agent restart (--keep-services); None: not here
    keeper: KeeperHost | None = None
    # the service manager running the agent (systemd); None: none is known here
    service_manager: ServiceManager | None = None
    # connections by duplication (Windows); None: the ends ride along the messages (POSIX)
    handovers: Handovers | None = None
    tether: TetherHost | None = None  # runners die with the agent (fateapi.py); None: Windows
    nudges: Nudges | None = None  # runners told of control.json changes (fateapi.py); None: none
