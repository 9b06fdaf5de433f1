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
)


class UsageError(ValueError):
    """Bad launcher arguments: the launcher treats it as a setup failure (exit 70)."""


class LaunchRequest:
    """What the launcher was asked to do. (A plain class: dataclasses would import inspect,
    ~15 ms more on every sandboxed process start.)"""

    __slots__ = ("net", "argv")

    def __init__(self, net: str, argv: tuple[str, ...]) -> None:
        self.net = net
        self.argv = argv

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LaunchRequest) and (self.net, self.argv) == (other.net, other.argv)

    def __hash__(self) -> int:
        return hash((self.net, self.argv))

    def __repr__(self) -> str:
        return f"LaunchRequest(net={self.net!r}, argv={self.argv!r})"


def parse_launch_args(args: list[str]) -> LaunchRequest:
    """``[--net none] -- ARGV...`` -> LaunchRequest. The ``--`` is required so that the
    child's own options can never be read as the launcher's."""
    net = "none"
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            argv = tuple(args[i + 1 :])
            if not argv:
                raise UsageError("no command given after '--'")
            return LaunchRequest(net, argv)
        if arg == "--net" or arg.startswith("--net="):
            if arg == "--net":
                if i + 1 >= len(args):
                    raise UsageError("--net needs a value")
                value = args[i + 1]
                i += 2
            else:
                value = arg.split("=", 1)[1]
                i += 1
            if value not in NET_MODES:
                raise UsageError(f"unsupported --net {value!r} (supported: {', '.join(NET_MODES)})")
            net = value
            continue
        if not arg.startswith("-"):
            raise UsageError(
                f"missing '--' before the command {arg!r} (usage: launch [--net none] -- ARGV...)"
            )
        raise UsageError(f"unknown argument {arg!r} (usage: launch [--net none] -- ARGV...)")
    raise UsageError("missing '--' before the command (usage: launch [--net none] -- ARGV...)")


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
    return caps
