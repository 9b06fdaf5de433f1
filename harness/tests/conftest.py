from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# The harness is not an installed package: it runs from the repository root (python -m harness).
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.nodes.backends import Backend, make_backends  # noqa: E402
from harness.nodes.procs import processes_under  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def no_leftover_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """No process of any harness test survives the session.

    Runs with long out dirs put node folders in a short temporary folder (harness.e2e.scenario's
    `place`). Each session (each pytest-xdist worker) gives the harness, in process and in the
    `python -m harness` it starts, a temporary folder of its own, so that this check sees only
    its own runs' nodes and never a live node of a neighbouring worker."""
    base = tmp_path_factory.getbasetemp()
    own_tmp = Path(tempfile.mkdtemp(prefix="oarbank-t-"))
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = tempfile.tempdir = str(own_tmp)
    try:
        yield
    finally:
        if saved[0] is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved[0]
        tempfile.tempdir = saved[1]
    left = processes_under(base) + processes_under(own_tmp)
    shutil.rmtree(own_tmp, ignore_errors=True)
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

