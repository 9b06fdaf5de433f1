from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The harness is not an installed package: it runs from the repository root (python -m harness).
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.backends import Backend, make_backends  # noqa: E402
from harness.procs import processes_under  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No process of any harness test survives the session."""
    import tempfile

    base = tmp_path_factory.getbasetemp()
    # Runs with long out dirs put node folders under <tmp>/oarbank-e2e-<pid>/. Only those made
    # during this session are ours: another harness run on the machine is not this session's.
    shorts = set(Path(tempfile.gettempdir()).glob("oarbank-e2e-*"))
    yield
    left = processes_under(base)
    for short in set(Path(tempfile.gettempdir()).glob("oarbank-e2e-*")) - shorts:
        left += processes_under(short)
    assert not left, "processes left behind by the harness tests:\n" + "\n".join(map(str, left))


@pytest.fixture(scope="module", params=["local", "container:bookworm"])
def backend(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
            system_package: Callable[[str], None]) -> Iterator[Backend]:
    """Each backend this machine can run, set up (the container one builds or reuses its
    image and starts a Docker engine if none runs), torn down after the test."""
    if request.param.startswith("container"):
        system_package("docker.io")
        system_package("debootstrap")
    [b] = make_backends(request.param)
    why = b.unavailable()
    if why:
        pytest.skip(f"{request.param} cannot run here: {why}")
    b.setup(tmp_path_factory.mktemp("backend"))
    try:
        yield b
    finally:
        b.teardown()
