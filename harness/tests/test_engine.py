"""The harness's own Docker engine is shared by the runs that use it at the same time.

Two harness runs on one machine (two test workers, CI next to a developer's run) join the same
dockerd. The first to end used to stop it under the other (`FileNotFoundError` on the socket in
the middle of a container test); now the last user stops it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.nodes.engine import engine_available

pytestmark = pytest.mark.xdist_group("containers")

# One harness run: join the engine, say so, hold it until told to end, then leave.
RUN = textwrap.dedent("""
    import sys
    from harness.nodes.engine import start_engine
    e = start_engine()
    print(e.url, e.client.ping(), flush=True)
    sys.stdin.readline()
    print(e.client.ping(), flush=True)
    e.close()
""")


def _dockerd_pid(cache: Path) -> int | None:
    try:
        pid = int((cache / "docker" / "dockerd.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def test_the_last_run_using_the_engine_stops_it(system_package, tmp_path: Path) -> None:
    system_package("docker.io")
    if engine_available() is not None:
        pytest.skip(engine_available())
    cache = Path(os.environ.get("OARBANK_HARNESS_CACHE") or tmp_path / "cache")
    env = dict(os.environ, OARBANK_HARNESS_CACHE=str(cache))
    env.pop("DOCKER_HOST", None)
    if subprocess.run(["docker", "-H", "unix:///var/run/docker.sock", "info"],
                      capture_output=True).returncode == 0:
        pytest.skip("a system Docker engine runs here: the harness uses it and starts none")
    runs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(2):  # one after the other: the first starts the engine, the second joins
            r = subprocess.Popen([sys.executable, "-c", RUN], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env)
            runs.append(r)
            assert r.stdout is not None and r.stdout.readline().split()[1] == "True"
        first, second = runs
        pid = _dockerd_pid(cache)
        assert pid is not None
        # The first run ends: the engine stays up for the second, which can still use it.
        first.communicate("\n", timeout=60)
        assert first.returncode == 0
        assert _dockerd_pid(cache) == pid
        out, _ = second.communicate("\n", timeout=90)
        assert second.returncode == 0 and out.split() == ["True"], out
        # The second was the last: it stopped the engine (unless another run joined it since).
        if not _shared_with_others(cache):
            assert _dockerd_pid(cache) is None
    finally:
        for r in runs:
            if r.poll() is None:
                r.kill()
                r.wait(10)


def _shared_with_others(cache: Path) -> bool:
    import fcntl

    with open(cache / "docker" / "users.lock", "w") as users:
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
