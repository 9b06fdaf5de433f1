"""What the sandbox refuses and how to tell it took effect: pure data and pure decisions.

No system calls here, so every rule can be read (and unit-tested) in one place. ``_linux``
applies this table; ``launch`` and the probe interpret results with the helpers below.
"""

from __future__ import annotations

import errno

__all__ = [
    "EXIT_SETUP_FAILED",
    "EXIT_EXEC_FAILED",
    "FAULT_ENV",
    "FAULTS",
    "NET_MODES",
    "REFUSED_SYSCALLS",
    "REFUSAL_ERRNO",
    "CAPABILITY_NAMES",
    "ENFORCED",
    "UNAVAILABLE",
    "UsageError",
    "LaunchRequest",
    "parse_launch_args",
    "parse_proc_status",
    "confinement_problem",
    "derive_capabilities",
]

# The launcher's own exit codes (contract: 70 setup failed, 71 exec failed). Any other exit
# status is the child's: the launcher execs it, so it has the launcher's pid.
EXIT_SETUP_FAILED = 70
EXIT_EXEC_FAILED = 71
# What starts the launcher's one stderr line when it refuses (exit 70 or 71).
LAUNCHER_PREFIX = "oarbank-sandbox: "

# Test hook, read ONLY by the launcher. Every accepted value makes setup fail (exit 70), so the
# hook can never weaken confinement, only prove that the refusal path is real:
#   nnp     - setting no_new_privs is made to fail
#   seccomp - loading the filter is made to fail
#   verify  - the filter is silently NOT loaded; the /proc/self/status check must catch it
# An unknown value is itself a setup failure (a typo must not look like a passing run).
FAULT_ENV = "OARBANK_SANDBOX_FAULT"
FAULTS = ("nnp", "seccomp", "verify")

NET_MODES = ("none",)

# Refused with EPERM (never killed: a refused call is an error the program can report, which
# is what the conformance kit and the service's own logs need to show).
REFUSAL_ERRNO = errno.EPERM

# Each syscall the filter refuses, unconditionally, and why. On x86-64 the filter also covers
# the i386 and x32 ABIs; libseccomp expands each socket rule to the i386 ``socketcall``
# multiplexer as well, so 32-bit programs get the same answer.
REFUSED_SYSCALLS: dict[str, str] = {
    # No inbound, ever: nothing may listen or take a connection, even on a socket it was given.
    "listen": "no listening socket",
    "accept": "no inbound connection on an inherited listening socket",
    "accept4": "no inbound connection on an inherited listening socket",
    # socket() for EVERY family: IPv4/IPv6 (net mode none), AF_UNIX (a path or abstract name
    # someone could find), AF_PACKET/AF_NETLINK/... (everything else). socketpair() is not in
    # this table: an endpoint's streams are socketpair ends.
    "socket": "no new sockets of any family (socketpair stays allowed)",
    # Sockets a process already holds are connected socketpair ends handed over by the agent:
    # they never need bind or connect (connect on one would fail with EISCONN anyway). Refusing
    # both closes the gap of a parent leaking an unconnected socket into the sandbox.
    "bind": "no name for a socket (path, abstract, or address)",
    "connect": "no outgoing connection from a socket passed in",
    # io_uring can create and connect sockets without going through the filtered syscalls.
    "io_uring_setup": "io_uring bypasses seccomp for socket operations",
    # pidfd_getfd copies a descriptor (say, a listening socket) out of another process.
    "pidfd_getfd": "no taking another process's sockets",
}

# Process walls: no reading or writing another process's memory, no tracing, no comparing
# its descriptors, no signal through a pidfd (Landlock's signal scope covers kill() and
# friends for a runner; pidfd_send_signal is refused outright: nothing a job does needs it).
PROCESS_SYSCALLS: dict[str, str] = {
    "ptrace": "no tracing (of any process: a sandboxed process has nothing it may trace)",
    "process_vm_readv": "no reading another process's memory",
    "process_vm_writev": "no writing another process's memory",
    "kcmp": "no probing another process's descriptors and memory layout",
    "pidfd_send_signal": "no signal through a pidfd (or a /proc/<pid> directory descriptor)",
    "tkill": "obsolete single-thread kill: a thread id is not checked against a process",
}

# The kernel's attack surface a batch job never needs (the upstream agent refuses the same
# list). Most also need a capability the launcher drops; refusing them here also covers a
# non-root agent's children inside their own user namespace, and keeps the kernel code out
# of reach entirely.
PRIVILEGED_SYSCALLS: dict[str, str] = {
    "mount": "no mounts", "umount2": "no unmounts", "pivot_root": "no root switch",
    "chroot": "no root switch",
    "open_tree": "no mount API", "move_mount": "no mount API", "fsopen": "no mount API",
    "fsconfig": "no mount API", "fsmount": "no mount API", "fspick": "no mount API",
    "mount_setattr": "no mount API",
    "unshare": "no new namespaces", "setns": "no entering other namespaces",
    "bpf": "no eBPF programs or maps",
    "add_key": "no kernel keyrings", "request_key": "no kernel keyrings",
    "keyctl": "no kernel keyrings",
    "init_module": "no kernel modules", "finit_module": "no kernel modules",
    "delete_module": "no kernel modules",
    "kexec_load": "no kernel replacement", "kexec_file_load": "no kernel replacement",
    "perf_event_open": "no performance counters (a classic kernel attack surface)",
    "userfaultfd": "no userfaultfd (used to widen kernel race windows)",
    "open_by_handle_at": "no opening files by handle (bypasses path checks)",
    "name_to_handle_at": "no file handles",
    "acct": "no process accounting", "swapon": "no swap", "swapoff": "no swap",
    "reboot": "no reboot", "syslog": "no kernel log",
}
# Absent on some architectures (or in the libseccomp in use): skipped there, not a failure.
OPTIONAL_SYSCALLS = ("kexec_file_load", "open_tree", "move_mount", "fsopen", "fsconfig",
                     "fsmount", "fspick", "mount_setattr", "pidfd_send_signal", "tkill")

# clone() flags that make a namespace: clone() with any of them is refused (EPERM). clone3()
# passes its flags in memory seccomp cannot read, so clone3 answers ENOSYS and the C library
# falls back to clone(), whose flags the filter sees.
CLONE_NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
CLONE3_ERRNO = errno.ENOSYS

# Signals aimed at a guarded pid (the agent, given with --guard-pid) are refused by the filter
# whatever the Landlock scope: kill(pid) and kill(-its pgid), tgkill/rt_(tg)sigqueueinfo to it,
# pidfd_open of it; and kill(-1) (every process the caller may signal) always.
SIGNAL_SYSCALLS_BY_PID = ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
                          "pidfd_open")

# What every sandboxed process may read (and execute) besides the paths it is given: the system
# directories programs and the C library need. /etc is a list, not the folder (/etc/shadow is
# root-owned 0640: a root child without capabilities could still read it). /proc and /sys are
# readable: another process's /proc/<pid>/{mem,environ,...} is guarded by ptrace access checks,
# which Landlock scopes to the sandbox's own processes.
SYSTEM_READ = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt/conda",
    "/proc", "/sys",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
    "/etc/timezone", "/etc/zoneinfo", "/etc/nsswitch.conf", "/etc/passwd", "/etc/group",
    "/etc/hosts", "/etc/host.conf", "/etc/resolv.conf", "/etc/gai.conf", "/etc/protocols",
    "/etc/services", "/etc/mime.types", "/etc/ssl", "/etc/ca-certificates", "/etc/pki",
    "/etc/alternatives", "/etc/os-release", "/etc/lsb-release", "/etc/debian_version",
    "/etc/machine-id", "/etc/locale.alias", "/etc/locale.conf", "/etc/default/locale",
    "/etc/python3", "/etc/fonts", "/etc/magic", "/etc/inputrc", "/etc/terminfo",
)
# Readable and writable device nodes (nothing else of /dev: no /dev/mem, disks, ttys, shm).
SYSTEM_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# Added for a module with [sandbox].devices.gpu = "compute" (--gpu): the nodes the CUDA, ROCm
# and DRM user-space drivers open (nvidia-uvm, nvidiactl, nvidia<N>, nvidia-caps, kfd, dri/*).
GPU_DEVICES_GLOBS = ("/dev/nvidia*", "/dev/nvidia-caps", "/dev/dri", "/dev/kfd")
SIGNAL_MODES = ("scoped", "open")

# What a GPU driver needs besides its device nodes, granted only with `--gpu` (a module with
# [sandbox].devices.gpu = "compute"). Measured on an NVIDIA H200, driver 580 (docs/contract-map.md
# G15): cuInit opens an AF_UNIX SOCK_SEQPACKET socket, binds it to the abstract name
# "@cuda-uvmfd-<netns>-<pid>@" and listens on it, and writes under its own /proc/self/task/<tid>/;
# refusing either makes it fail (CUDA_ERROR_OPERATING_SYSTEM).
# - Sockets: socket() of family AF_UNIX and a connection-oriented type, bind() and listen() are
#   allowed. connect() and accept() stay refused, no folder ever grants Landlock's MAKE_SOCK (so
#   no path socket can be made), and the name lives in the child's own network namespace under
#   Landlock's abstract-socket scope: nothing outside its sandbox can reach it. Granted only
#   where one of those two keeps the name private.
# - /proc writable, only for a non-root child: file modes then keep it off root-owned sysctls,
#   /proc/sysrq-trigger and the (undumpable, so root-owned) agent's files; it can still write
#   the /proc files of same-user processes that have no ptrace check (oom_score_adj upwards,
#   coredump_filter, clear_refs). A root child gets no /proc writes, and CUDA fails there.
GPU_SOCKET_FAMILY = 1  # AF_UNIX
GPU_SOCKET_TYPES = (1, 5)  # SOCK_STREAM, SOCK_SEQPACKET (type & SOCK_TYPE_MASK)
SOCK_TYPE_MASK = 0xF
GPU_ALLOWED_SYSCALLS = ("bind", "listen")
GPU_PROC_WRITE = "/proc"

ENFORCED = "enforced"
UNAVAILABLE = "unavailable"

# The names capabilities() reports, each "enforced" or "unavailable".
CAPABILITY_NAMES = (
    "no_new_privs",  # PR_SET_NO_NEW_PRIVS: no setuid gain, and required for an unprivileged filter
    "seccomp_listen",  # listen/accept refused, also on sockets passed in
    "seccomp_socket",  # socket() refused for every family, socketpair allowed
    "seccomp_bind_connect",  # bind/connect refused on sockets passed in
    "seccomp_io_uring",  # io_uring_setup refused
    "netns",  # a fresh network namespace: no loopback, own abstract-unix namespace
    "loopback",  # loopback unreachable (socket refusal, and netns where available)
    "abstract_unix",  # no abstract unix name can be created or reached
    "macos_seatbelt",  # sandbox-exec deny-default profile (macOS only)
    "landlock_fs",  # writes only the paths given, reads only those and the system's (Landlock)
    "landlock_signal",  # no signal to a process outside its own sandbox (Landlock scope, ABI 6)
    "landlock_abstract_unix",  # no abstract unix socket outside its sandbox (Landlock scope)
    "caps_dropped",  # no capabilities (bounding, permitted, effective, inheritable, ambient)
    "seccomp_ptrace",  # ptrace, process_vm_readv/writev, kcmp, pidfd_send_signal refused
    "seccomp_privileged",  # mounts, namespaces, bpf, keyrings, modules, perf, userfaultfd refused
    "devices",  # /dev: only null, zero, full, random, urandom (+ GPU nodes when declared)
)

# What each wall leaves open when it is unavailable (the agent's start-up WARNING).
WALL_GAPS = {
    "no_new_privs": "setuid programs and file capabilities could raise privileges",
    "seccomp_listen": "a process could listen or accept connections",
    "seccomp_socket": "a process could open sockets of any family",
    "seccomp_bind_connect": "a process could bind or connect sockets passed to it",
    "seccomp_io_uring": "io_uring could reach sockets around the filter",
    "netns": "loopback is reachable if a socket is ever created",
    "landlock_fs": ("jobs and services can read and write the agent's state dir (job records, "
                    "settings, other attempts), their bundle, the host's /tmp and $HOME"),
    "landlock_signal": "a job can signal other jobs' processes of the same user",
    "landlock_abstract_unix": "abstract unix sockets outside the sandbox are reachable "
                              "if a socket is ever created",
    "caps_dropped": "children of a root agent keep root's capabilities",
    "seccomp_ptrace": "a process can trace or read the memory of same-user processes",
    "seccomp_privileged": "mounts, namespaces, bpf, keyrings, kernel modules, perf events "
                          "and userfaultfd stay reachable",
    "devices": "every device node the user may open (disks, /dev/mem for root, ttys) is "
               "reachable",
}


class UsageError(ValueError):
    """Bad launcher arguments: the launcher treats it as a setup failure (exit 70)."""


class LaunchRequest:
    """What the launcher was asked to do. (A plain class: dataclasses would import inspect,
    ~15 ms more on every sandboxed process start.)"""

    __slots__ = ("net", "argv", "read", "write", "devices", "signals", "guard_pids", "notify_fd",
                 "gpu")

    def __init__(self, net: str, argv: tuple[str, ...], read: tuple[str, ...] = (),
                 write: tuple[str, ...] = (), devices: tuple[str, ...] = (),
                 signals: str = "scoped", guard_pids: tuple[int, ...] = (),
                 notify_fd: int | None = None, gpu: bool = False) -> None:
        self.gpu = gpu  # the GPU driver's needs (GPU_SOCKET_*, GPU_PROC_WRITE)
        self.net = net
        self.argv = argv
        self.read = read
        self.write = write
        self.devices = devices
        self.signals = signals
        self.guard_pids = guard_pids
        # --notify-fd: a supervisor's socketpair end; it sees every network attempt (_notify)
        self.notify_fd = notify_fd

    def _key(self) -> tuple:
        return (self.net, self.argv, self.read, self.write, self.devices, self.signals,
                self.guard_pids, self.notify_fd)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LaunchRequest) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return "LaunchRequest(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


_USAGE = ("usage: launch [--net none] [--read PATH]... [--write PATH]... [--dev PATH]... "
          "[--gpu] [--signals scoped|open] [--guard-pid PID]... [--notify-fd FD] -- ARGV...")
_PATH_OPTIONS = {"--read": "read", "--write": "write", "--dev": "devices"}


def parse_launch_args(args: list[str]) -> LaunchRequest:
    """``[options] -- ARGV...`` -> LaunchRequest. The ``--`` is required so that the child's
    own options can never be read as the launcher's. Paths must be absolute."""
    net = "none"
    signals = "scoped"
    lists: dict[str, list[str]] = {"read": [], "write": [], "devices": []}
    guards: list[int] = []
    notify_fd: int | None = None
    gpu = False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            argv = tuple(args[i + 1 :])
            if not argv:
                raise UsageError("no command given after '--'")
            return LaunchRequest(net, argv, tuple(lists["read"]), tuple(lists["write"]),
                                 tuple(lists["devices"]), signals, tuple(guards), notify_fd,
                                 gpu)
        if arg == "--gpu":  # a flag: no value
            gpu = True
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name not in ("--net", "--signals", "--guard-pid", "--notify-fd", *_PATH_OPTIONS):
            if not arg.startswith("-"):
                raise UsageError(f"missing '--' before the command {arg!r} ({_USAGE})")
            raise UsageError(f"unknown argument {arg!r} ({_USAGE})")
        if eq:
            i += 1
        else:
            if i + 1 >= len(args):
                raise UsageError(f"{name} needs a value")
            value = args[i + 1]
            i += 2
        if name == "--net":
            if value not in NET_MODES:
                raise UsageError(f"unsupported --net {value!r} (supported: {', '.join(NET_MODES)})")
            net = value
        elif name == "--signals":
            if value not in SIGNAL_MODES:
                raise UsageError(f"unsupported --signals {value!r} (supported: {', '.join(SIGNAL_MODES)})")
            signals = value
        elif name == "--guard-pid":
            if not value.isdigit() or int(value) < 2:
                raise UsageError(f"--guard-pid needs a process id, got {value!r}")
            guards.append(int(value))
        elif name == "--notify-fd":
            if not value.isdigit() or int(value) < 3:
                raise UsageError(f"--notify-fd needs a descriptor number >= 3, got {value!r}")
            notify_fd = int(value)
        else:
            if not value.startswith("/"):
                raise UsageError(f"{name} needs an absolute path, got {value!r}")
            lists[_PATH_OPTIONS[name]].append(value)
    raise UsageError(f"missing '--' before the command ({_USAGE})")


def parse_proc_status(text: str) -> dict[str, str]:
    """``/proc/<pid>/status`` -> {field: value}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def confinement_problem(status: dict[str, str]) -> str | None:
    """None when the status shows no_new_privs set and a seccomp filter (mode 2) in force;
    otherwise what is missing, for the launcher's one-line refusal."""
    nnp = status.get("NoNewPrivs")
    mode = status.get("Seccomp")
    if nnp != "1":
        return f"NoNewPrivs is {nnp!r} in /proc/self/status, expected '1'"
    if mode != "2":
        return f"Seccomp is {mode!r} in /proc/self/status, expected '2' (filter mode)"
    return None


def _refused(result: object) -> bool:
    # A probe outcome: the errno number the operation failed with, or "ok" if it succeeded.
    return result in (errno.EPERM, errno.EACCES)


def derive_capabilities(probe: dict | None, platform: str) -> dict[str, str]:
    """Capability report from what a probe child really observed inside the launcher.

    ``probe`` is None when the launcher could not start a confined child at all. Nothing is
    reported enforced that the probe did not see refused.
    """
    caps = dict.fromkeys(CAPABILITY_NAMES, UNAVAILABLE)
    if probe is None:
        return caps
    ops = probe.get("ops", {})

    def state(ok: bool) -> str:
        return ENFORCED if ok else UNAVAILABLE

    if platform == "darwin":
        caps["macos_seatbelt"] = state(_refused(ops.get("bind_inet")) and _refused(ops.get("listen_unix")))
        caps["loopback"] = state(_refused(ops.get("connect_inet")))
        return caps
    status = probe.get("status", {})
    socket_ops = ("socket_inet", "socket_inet6", "socket_unix", "socket_packet", "socket_netlink")
    caps["no_new_privs"] = state(status.get("NoNewPrivs") == "1")
    caps["seccomp_listen"] = state(
        status.get("Seccomp") == "2" and _refused(ops.get("listen_held")) and _refused(ops.get("accept_held"))
    )
    caps["seccomp_socket"] = state(
        status.get("Seccomp") == "2"
        and all(_refused(ops.get(name)) for name in socket_ops)
        and ops.get("socketpair") == "ok"
    )
    caps["seccomp_bind_connect"] = state(
        status.get("Seccomp") == "2" and _refused(ops.get("bind_held")) and _refused(ops.get("connect_held"))
    )
    caps["seccomp_io_uring"] = state(status.get("Seccomp") == "2" and _refused(ops.get("io_uring_setup")))
    caps["netns"] = state(bool(probe.get("own_netns")))
    # Without socket() nothing can reach loopback or create/reach an abstract name, whatever
    # the namespace; a fresh netns additionally takes loopback down and separates the names.
    no_new_sockets = caps["seccomp_socket"] == ENFORCED and caps["seccomp_bind_connect"] == ENFORCED
    caps["loopback"] = state(no_new_sockets)
    caps["abstract_unix"] = state(no_new_sockets)
    filtered = status.get("Seccomp") == "2"
    # Files: outside the granted paths nothing is written or listed (EACCES is Landlock's
    # answer), inside them writing works.
    caps["landlock_fs"] = state(
        ops.get("fs_write_outside") == errno.EACCES and ops.get("fs_read_outside") == errno.EACCES
        and ops.get("fs_write_granted") == "ok")
    # kill(<the process that ran the probe>, 0): EPERM only from the scope (the probe is
    # launched without --guard-pid, and that process is the same user).
    caps["landlock_signal"] = state(ops.get("signal_outside") == errno.EPERM)
    # Both scopes are set in the one ruleset on ABI >= 6; the abstract one cannot be observed
    # from inside (socket() is refused first), so it stands or falls with the signal scope.
    caps["landlock_abstract_unix"] = state(
        caps["landlock_signal"] == ENFORCED and int(probe.get("landlock_abi") or 0) >= 6)
    cap_fields = ("CapInh", "CapPrm", "CapEff", "CapAmb")
    zero = all(status.get(f) is not None and int(status[f], 16) == 0 for f in cap_fields)
    bounding = status.get("CapBnd")
    # As root the bounding set must be empty too (exec as uid 0 would refill permitted from it).
    root = str(status.get("Uid", "")).split()[:1] == ["0"]
    caps["caps_dropped"] = state(
        zero and (not root or (bounding is not None and int(bounding, 16) == 0)))
    caps["seccomp_ptrace"] = state(filtered and all(
        ops.get(n) == errno.EPERM for n in ("ptrace", "process_vm_readv", "kcmp")))
    caps["seccomp_privileged"] = state(filtered and all(
        ops.get(n) == errno.EPERM for n in ("unshare", "clone_newns", "bpf", "keyctl",
                                           "perf_event_open", "userfaultfd"))
        and ops.get("clone3") == errno.ENOSYS)
    caps["devices"] = state(ops.get("dev_list") == errno.EACCES and ops.get("dev_basic") == "ok")
    return caps
