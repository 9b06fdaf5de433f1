"""Seccomp user notification: every network attempt of a confined process reaches a supervisor.

The plain filter answers ``socket``, ``bind``, ``listen``, ``connect``, ``accept`` and
``accept4`` with EPERM itself: the kernel refuses, and nobody outside the process learns that
it tried. A supervisor that must *see* attempts (the conformance kit, the agent) gives the
launcher one end of a socketpair: ``launch --notify-fd N -- ARGV``. Then those syscalls are
``SCMP_ACT_NOTIFY`` instead of ``ERRNO(EPERM)`` in the same single filter (not a second,
stacked one: the kernel takes the highest-precedence action of all filters, and ERRNO beats
USER_NOTIF, so a notify filter stacked on the errno one would never fire), and:

1. the launcher loads the filter, sends the listener descriptor over N (``SCM_RIGHTS``, with
   the line ``F<launcher pid>``), closes its copy;
2. runs its self-test, which asks nothing of the supervisor (``_linux.py``'s step 6: a rule
   the kernel answers in the same program), so a launch waits on no round trip;
3. sends ``V`` (verified), closes N and execs ARGV.

The supervisor (``Watch``) answers every notification with EPERM (the call fails as it would
under the plain filter: nothing is ever allowed) after recording who tried: thread id, its
process (``Tgid``), ``/proc/<pid>/comm`` and command line, the syscall's name. Attempts of the
launcher's pid before ``V`` are not recorded (an older launcher's self-test made two): the
launcher cannot send ``V`` before the supervisor answered them, so ``V`` is always read before
a later attempt is classified. Nothing the confined process writes (stdout, stderr, logs) is read.

If the supervisor goes away, the kernel answers the waiting and later calls ENOSYS: still
refused, never allowed. A process can hold one listener at most: a launcher run inside another
notifying sandbox fails its setup (exit 70).

The launcher side imports only what it needs (no threads); ``Watch`` is the supervisor side.
"""

from __future__ import annotations

# The launcher imports this module on every watched start: only cheap C-level modules here
# (`socket` would pull in `enum`, and `contextlib`/`threading` more: several ms a start). The
# supervisor's side imports the rest where it runs.
import _socket
import array
import errno
import fcntl
import os
import select
import struct

__all__ = ["NOTIFIED_SYSCALLS", "OPTION", "Attempt", "Watch", "hand_over", "verified",
           "listener_fd"]

OPTION = "--notify-fd"

# Notified instead of refused by the filter itself (the rest of REFUSED_SYSCALLS stays EPERM).
NOTIFIED_SYSCALLS = ("socket", "bind", "listen", "connect", "accept", "accept4")


def _ioc(direction: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (ord("!") << 8) | nr


_NOTIF = struct.Struct("=QIIiIQ6Q")  # struct seccomp_notif: id, pid, flags, {nr, arch, ip, args}
_RESP = struct.Struct("=QqiI")  # struct seccomp_notif_resp: id, val, error, flags
_IOCTL_RECV = _ioc(3, 0, _NOTIF.size)  # SECCOMP_IOCTL_NOTIF_RECV, _IOWR('!', 0, ...)
_IOCTL_SEND = _ioc(3, 1, _RESP.size)  # SECCOMP_IOCTL_NOTIF_SEND, _IOWR('!', 1, ...)
_IOCTL_ID_VALID = _ioc(1, 2, 8)  # SECCOMP_IOCTL_NOTIF_ID_VALID, _IOW('!', 2, __u64)


# --- the launcher's side ----------------------------------------------------------------------


def listener_fd(pyseccomp, filt) -> int:
    """The listener descriptor of a loaded filter with notify rules (libseccomp's
    ``seccomp_notify_fd``; pyseccomp has no public accessor for it)."""
    lib = getattr(pyseccomp, "_libseccomp", None)
    if lib is None or not hasattr(lib, "seccomp_notify_fd"):
        raise OSError("this libseccomp/pyseccomp has no seccomp_notify_fd")
    fd = int(lib.seccomp_notify_fd(filt._filter))
    if fd < 0:
        raise OSError(f"seccomp_notify_fd failed: {os.strerror(-fd)}")
    return fd


def hand_over(sock_fd: int, listener: int) -> None:
    """Send the listener to the supervisor and close our copy of it."""
    sock = _socket.socket(fileno=sock_fd)
    try:
        msg = b"F%d\n" % os.getpid()
        sock.sendmsg([msg], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS,
                              array.array("i", [listener]).tobytes())])
    finally:
        sock.detach()
        os.close(listener)


def verified(sock_fd: int) -> None:
    """Self-test done: later attempts of this pid are the child's. Closes ``sock_fd``."""
    try:
        os.write(sock_fd, b"V")
    finally:
        os.close(sock_fd)


# --- the supervisor's side --------------------------------------------------------------------


class Attempt:
    """One refused attempt: which process tried which call. (A plain class: the launcher
    imports this module, and dataclasses would cost every notifying launch ~15 ms.)"""

    __slots__ = ("pid", "tid", "syscall", "family", "comm", "argv")

    def __init__(self, pid: int, tid: int, syscall: str, comm: str, argv: str,
                 family: str = "") -> None:
        self.pid = pid  # the process (thread group) id
        self.tid = tid  # the thread that called
        self.syscall = syscall
        self.family = family  # socket(): the address family asked for, e.g. "AF_INET"
        self.comm = comm
        self.argv = argv  # the command line on one line, cut at 200 characters

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self) -> str:
        return f"Attempt({self.as_dict()!r})"

    def __str__(self) -> str:
        return f"{self.syscall}({self.family}) by pid {self.pid} ({self.comm}: {self.argv})"


def _read(path: str, limit: int = 4096) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def _tgid(tid: int) -> int:
    for line in _read(f"/proc/{tid}/status").decode("utf-8", "replace").splitlines():
        if line.startswith("Tgid:"):
            try:
                return int(line.split()[1])
            except ValueError:
                break
    return tid


_names: dict[tuple[int, int], str] = {}


def _syscall_name(arch: int, nr: int) -> str:
    key = (arch, nr)
    if key not in _names:
        name = f"syscall {nr}"
        try:
            import pyseccomp

            raw = pyseccomp.resolve_syscall(arch, nr)
            if raw:
                name = raw.decode() if isinstance(raw, bytes) else str(raw)
        except Exception:  # noqa: BLE001 - a name is a nicety; the number is still reported
            pass
        _names[key] = name
    return _names[key]


def _family(value: int) -> str:
    try:
        import socket

        return socket.AddressFamily(value & 0xFFFFFFFF).name
    except ValueError:
        return f"family {value & 0xFFFFFFFF}"


class Session:
    """The supervision of one launch, driven by whoever waits for readiness: a thread
    (``Watch``) or an event loop (the agent: ``loop.add_reader``). ``sock`` is the supervisor's
    end of the socketpair; ``record`` gets each attempt (not the launcher's self-test) before
    the call is answered. Call ``on_sock()`` when ``sock`` is readable (False: nothing more
    will come on it), ``on_listener()`` when ``listener`` is readable (False: no process uses
    the filter any more, the session is over); ``close()`` at the end."""

    def __init__(self, sock, record) -> None:  # a socket.socket; Attempt -> None
        self.sock = sock
        self.listener: int | None = None
        self.launcher_pid = 0
        self.sock_open = True
        self._verified = False
        self._record = record
        self._buf = bytearray(_NOTIF.size)

    def on_sock(self) -> bool:
        if self.listener is None:
            return self._hand_over()
        if self.sock_open and not self._drain():
            self.sock_open = False
        return self.sock_open

    def _hand_over(self) -> bool:
        # close-on-exec from the start: nothing the supervisor starts may inherit a listener
        msg, anc, _flags, _addr = self.sock.recvmsg(64, _socket.CMSG_SPACE(4 * 4),
                                                    _socket.MSG_CMSG_CLOEXEC)
        fds: list[int] = []
        for level, kind, data in anc:
            if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                fds.extend(array.array("i", data[: len(data) - len(data) % 4]))
        if not msg or not msg.startswith(b"F") or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            if not msg:  # the launcher exited (or never ran) without handing one over
                self.sock_open = False
                return False
            raise RuntimeError(f"unexpected hand-over from the launcher: {msg[:40]!r}")
        self.launcher_pid = int(msg[1:].split(b"\n", 1)[0])
        self._verified = b"V" in msg  # (the two writes may arrive together)
        self.listener = fds[0]
        return True

    def _drain(self) -> bool:
        """Read what the launcher sent since (``V``); False once it closed its end."""
        while True:
            try:
                data = self.sock.recv(64, _socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not data:
                return False
            if b"V" in data:
                self._verified = True

    def on_listener(self) -> bool:
        """Answer one pending call (never blocks: a poll says whether one is there)."""
        assert self.listener is not None
        p = select.poll()
        p.register(self.listener, select.POLLIN)
        events = p.poll(0)
        ev = events[0][1] if events else 0
        if not ev & select.POLLIN:
            return not ev & (select.POLLHUP | select.POLLERR)
        self._buf[:] = bytes(_NOTIF.size)  # the kernel wants it zeroed (else EINVAL)
        try:
            fcntl.ioctl(self.listener, _IOCTL_RECV, self._buf, True)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.EINTR):
                return True  # the caller died (or a signal) before we took it
            raise
        self._one(self._buf)
        return True

    def _one(self, buf: bytearray) -> None:
        assert self.listener is not None
        nid, tid, _flags, nr, arch, _ip, arg0, *_args = _NOTIF.unpack(buf)
        if self.sock_open and not self._drain():  # a `V` written before this call must be
            self.sock_open = False                # seen before classifying it
        if not (tid == self.launcher_pid and not self._verified):  # else: the self-test
            comm = _read(f"/proc/{tid}/comm", 64).decode("utf-8", "replace").strip()
            cmd = " ".join(_read(f"/proc/{tid}/cmdline").decode("utf-8", "replace")
                           .replace("\0", " ").split())
            name = _syscall_name(arch, nr)
            family = _family(arg0) if name == "socket" else ""
            attempt = Attempt(_tgid(tid), tid, name, comm or "?", cmd[:200] or "?", family)
            # What /proc said is about this caller only if it is still waiting (no pid reuse).
            try:
                fcntl.ioctl(self.listener, _IOCTL_ID_VALID, struct.pack("=Q", nid))
            except OSError:
                pass
            # Recorded before the answer: once the call returns in the confined process, a
            # reader that learns of anything that process did later sees it.
            self._record(attempt)
        try:
            fcntl.ioctl(self.listener, _IOCTL_SEND, bytearray(_RESP.pack(nid, 0, -errno.EPERM, 0)))
        except OSError:
            pass  # ENOENT: the caller died meanwhile

    def close(self) -> None:
        if self.listener is not None:
            os.close(self.listener)
            self.listener = None


class Watch:
    """The supervisor of one launch, in a thread of its own: ``child_fd`` goes to the launcher
    (``pass_fds`` and ``wrap(..., notify_fd=child_fd)``); call ``spawned()`` once the launcher
    runs (or failed to start), ``take()`` for the attempts recorded since the last call,
    ``close()`` at the end (answers nothing more: pending and later calls of the confined
    processes get ENOSYS). Thread-safe. ``limit`` bounds what is kept (``total`` still counts
    everything)."""

    def __init__(self, name: str = "oarbank-notify", limit: int = 200) -> None:
        import socket
        import threading

        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.child_fd: int | None = theirs.detach()
        self._wake_r, self._wake_w = os.pipe()
        self._lock = threading.Lock()
        self._attempts: list[Attempt] = []
        self._taken = 0
        self._limit = limit
        self.total = 0
        self.error: str | None = None  # why the watch stopped early (never a confined call)
        self.listening = threading.Event()  # set when the launcher's listener arrived
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- the caller's side

    def spawned(self) -> None:
        """The launcher holds its end now (or will never run): close ours."""
        if self.child_fd is not None:
            os.close(self.child_fd)
            self.child_fd = None

    def finished(self) -> bool:
        """True once no process uses the filter any more (or the launcher never handed it)."""
        return not self._thread.is_alive()

    def attempts(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts)

    def take(self) -> list[Attempt]:
        """Attempts recorded since the last ``take``."""
        with self._lock:
            new = self._attempts[self._taken :]
            self._taken = len(self._attempts)
            return new

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.spawned()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        self._thread.join(10)
        self._sock.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

    # -- the thread

    def _record(self, attempt: Attempt) -> None:
        with self._lock:
            self.total += 1
            if len(self._attempts) < self._limit:
                self._attempts.append(attempt)

    def _run(self) -> None:
        session = Session(self._sock, self._record)
        try:
            self._loop(session)
        except Exception as exc:  # noqa: BLE001 - recorded; the confined calls then get ENOSYS
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            session.close()

    def _loop(self, session: Session) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        poller.register(self._sock.fileno(), select.POLLIN)
        while True:
            for fd, _ev in poller.poll():
                if fd == self._wake_r:
                    return
                if fd == self._sock.fileno():
                    had = session.listener is not None
                    if not session.on_sock():
                        if session.listener is None:
                            return  # no launcher, no listener: nothing to watch
                        poller.unregister(fd)
                    if not had and session.listener is not None:
                        poller.register(session.listener, select.POLLIN)
                        self.listening.set()
                elif not session.on_listener():
                    return  # no process uses the filter any more
