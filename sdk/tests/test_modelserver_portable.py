"""examples/modelserver, and what `oarbank-sdk new` makes of it, run unchanged on upstream's
SDK as on ours (issue 27 part 1).

Upstream's SDK is played by ``upstream_standin/oarbank_sdk/service_endpoint.py``: exactly
upstream's public names (``upstream_service_endpoint.json``), nothing of ours. It runs in an
interpreter of its own, a virtual environment that cannot see our packages, with the
stand-in on its path; the module's ops, daemon and runner all run there (``python -I``, as
the manifest says). The test plays the agent (``modelserver_helpers``, real processes, real
channel and connectors) and offers the `ready` feature, so a daemon that called what only our
SDK has would die (``AttributeError``) as the issue reports: the last test proves that it does.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from modelserver_helpers import BUNDLE, Service, argvs, run_job, with_python  # sdk/tests

from oarbank_sdk.conform import host
from oarbank_sdk.scaffold import new_module

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "upstream_standin"
UPSTREAM = json.loads((HERE / "upstream_service_endpoint.json").read_text(encoding="utf-8"))
PROMPTS = [f"prompt {i}" for i in range(10)]

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the stand-in passes fd:<n>")


@pytest.fixture(scope="module")
def upstream_python(tmp_path_factory) -> str:
    """An interpreter whose ``oarbank_sdk`` is the stand-in: a venv without our packages (nor
    the system's), the stand-in's folder on its path through a .pth file (read under -I too)."""
    root = tmp_path_factory.mktemp("upstream-sdk-venv")
    import venv  # here: Windows' embeddable CPython has none (the module skips there)

    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(root)
    python = str(root / "bin" / "python")
    purelib = subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True,
                             timeout=60).stdout.strip()
    Path(purelib, "upstream_standin.pth").write_text(f"{STANDIN}\n", encoding="utf-8")
    return python


def _public_names(python: str) -> tuple[str, list[str]]:
    """Where ``oarbank_sdk.service_endpoint`` comes from under ``python -I``, and its public
    names (the standard modules it imports left out)."""
    code = ("import inspect, json, oarbank_sdk.service_endpoint as ep; print(json.dumps("
            "[ep.__file__, sorted(n for n in dir(ep) if not n.startswith('_') "
            "and not inspect.ismodule(getattr(ep, n)))]))")
    out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True, check=True,
                         timeout=60, cwd=str(HERE.parent))
    where, names = json.loads(out.stdout)
    return where, names


def test_the_standin_has_exactly_upstreams_public_names_and_hides_ours(upstream_python):
    where, names = _public_names(upstream_python)
    assert Path(where).resolve() == STANDIN / "oarbank_sdk" / "service_endpoint.py"
    assert names == sorted(UPSTREAM["names"])
    # Ours has more (a superset): the stand-in is not ours under another name.
    from oarbank_sdk import service_endpoint as ours
    assert set(names) < {n for n in dir(ours) if not n.startswith("_")
                         and not inspect.ismodule(getattr(ours, n))}


def _module(kind: str, tmp_path: Path) -> tuple[Path, str, str]:
    """(bundle, service, stage) of the example itself, or of a module `new` made from it."""
    if kind == "example":
        return BUNDLE, "model", "generate"
    dest = tmp_path / "scorer"
    new_module(dest, "com.acme.scorer", "scorer", "score")
    return dest, "scorer", "score"


@pytest.mark.parametrize("sdk", ["upstream", "ours"])
@pytest.mark.parametrize("kind", ["example", "new"])
def test_service_and_runner_work_on_either_sdk(kind, sdk, upstream_python, tmp_path):
    bundle, name, stage = _module(kind, tmp_path)
    service_argv, runner_argv = argvs(bundle, name)
    if sdk == "upstream":
        service_argv = with_python(service_argv, upstream_python)
        runner_argv = with_python(runner_argv, upstream_python)
    svc = Service({"load_s": 0.2, "slots": 2}, argv=service_argv, bundle=bundle, name=name,
                  features="ready")
    try:
        start = svc.start()
        assert start.rc == 0 and start.doc == {"ok": True}, start.stderr
        pid = svc.channel.wait_hello(20)
        assert pid is not None, svc.channel.closed_reason
        assert svc.wait_ready(20).get("ready") is True, svc.op("status").stderr
        a = run_job(svc, {"prompts": PROMPTS}, attempt=f"{kind}-{sdk}", runner_argv=runner_argv,
                    stage=stage)
        assert a.rc == 0, a.stderr
        assert [t.split(" [")[0] for t in a.result["payload"]["texts"]] == [
            p[::-1] for p in PROMPTS]
        assert a.result["provenance"] == {"service_pids": [pid], "loads": 1}
        assert svc.channel.problems == [] and a.refusals == []
        if sdk == "upstream":
            # Upstream's ways, so the stand-in really ran on both sides: no `ready` message
            # (its Acceptor has no ready(); the `ready` op's marker did it), and a fresh
            # connection with `Connection: close` for every request.
            assert svc.channel.said_ready is False
            assert a.connects == len(PROMPTS)
        else:
            assert svc.channel.said_ready is True
            assert 1 <= a.connects <= 8  # ours keeps connections alive and reuses them
        stop = svc.op("stop", timeout_s=20)
        assert stop.rc == 0 and stop.doc == {"ok": True, "escalated": False}
        assert host.group_pids(svc.pgid) == []
    finally:
        svc.cleanup()


def test_the_stand_in_catches_a_module_that_needs_ours(upstream_python, tmp_path):
    # The example as it was before it looked `ready` up: on upstream's SDK its daemon dies.
    bundle = tmp_path / "needs-ours"
    new_module(bundle, "dev.example.needsours", "model", "generate")
    script = bundle / "model_service.py"
    text = script.read_text(encoding="utf-8")
    lookup = ('        say_ready = getattr(acc, "ready", None)  # our SDK\'s; upstream\'s has none: '
              'polled then\n        if callable(say_ready):\n            say_ready()')
    assert text.count(lookup) == 1, "the example's readiness lookup moved: update this test"
    script.write_text(text.replace(lookup, "        acc.ready()"), encoding="utf-8")
    service_argv = with_python(argvs(bundle)[0], upstream_python)
    svc = Service({"load_s": 0}, argv=service_argv, bundle=bundle, features="ready")
    try:
        assert svc.start(output_prefix=tmp_path / "start").rc == 0
        assert svc.channel.wait_hello(20) is not None
        deadline = time.monotonic() + 20
        while svc.op("status").doc != {"running": False, "ready": False}:  # the daemon dies
            assert time.monotonic() < deadline, "the daemon kept running"
            time.sleep(0.1)
        assert svc.channel.said_ready is False
        log = (tmp_path / "start.err").read_text(encoding="utf-8")
        assert "AttributeError: 'Acceptor' object has no attribute 'ready'" in log, log
    finally:
        svc.cleanup()
