"""A throwaway PostgreSQL server for tests and the benchmark: Debian's server binaries, a data
dir under /tmp, a unix socket only (no TCP port to collide with a neighbour's), trust auth.

PostgreSQL refuses to run as root: as root the cluster belongs to the ``postgres`` user (the
Debian package creates it) and its commands run through ``runuser``, in a folder that user can
reach (a TMPDIR only root may enter, as the harness tests' own, is passed over for /tmp).
fsync is off: a test's cluster is thrown away, durability would only cost time
(``durable=True`` keeps it on).
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PgCluster", "server_bindir"]

PORT = 5432  # only names the socket file (.s.PGSQL.5432) in our own folder


def server_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def _reachable_tmp() -> str:
    """The temp folder, if another user may pass through it and every folder above it; else
    /tmp."""
    tmp = Path(tempfile.gettempdir()).resolve()
    return str(tmp) if all(p.stat().st_mode & 0o001 for p in (tmp, *tmp.parents)) else "/tmp"


class PgCluster:
    def __init__(self, *, durable: bool = False, extra: list[str] | None = None) -> None:
        bindir = server_bindir()
        if bindir is None:
            raise RuntimeError("no PostgreSQL server (apt-get install postgresql)")
        self._as: list[str] = []
        as_root = hasattr(os, "geteuid") and os.geteuid() == 0
        self.dir = Path(tempfile.mkdtemp(prefix="oarbank-pg-",
                                         dir=_reachable_tmp() if as_root else None))
        if as_root:
            import pwd  # POSIX only; this module is imported on every platform (conftest)

            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self.data = self.dir / "data"
        self._seq = itertools.count()
        self.proc: subprocess.Popen[bytes] | None = None
        try:
            subprocess.run([*self._as, str(bindir / "initdb"), "-D", str(self.data), "-A",
                            "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"],
                           check=True, capture_output=True, timeout=120)
            self._settings = ["-c", "listen_addresses=", "-c",
                              f"unix_socket_directories={self.dir}", "-p", str(PORT),
                              "-c", "max_connections=200", "-c", "shared_buffers=128MB"]
            if not durable:
                self._settings += ["-c", "fsync=off", "-c", "full_page_writes=off",
                                   "-c", "synchronous_commit=off"]
            self._settings += list(extra or [])
            self._bindir = bindir
            self.start_server()
        except BaseException:
            self.stop()
            raise

    def start_server(self) -> None:
        """Start (or start again, on the same data) the server."""
        with open(self.dir / "server.log", "ab") as log:
            self.proc = subprocess.Popen([*self._as, str(self._bindir / "postgres"), "-D",
                                          str(self.data), *self._settings],
                                         stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready(60)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.dir}&port={PORT}"

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError("postgres exited: "
                                   + (self.dir / "server.log").read_text(errors="replace"))
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def create_database(self, prefix: str = "t") -> str:
        """A new empty database; its URL."""
        import psycopg

        name = f"{prefix}_{os.getpid()}_{next(self._seq)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        """Stop the server and delete its data."""
        self.stop_server()
        shutil.rmtree(self.dir, ignore_errors=True)

    def stop_server(self) -> None:
        """Stop the server; its data stays (``start_server`` brings it back)."""
        if self.proc is not None and self.proc.poll() is None:
            # SIGINT: "fast" shutdown (open sessions are ended); the server's group is ours
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
