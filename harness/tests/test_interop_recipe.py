"""docs/interop.md's by-hand recipe, run as it stands in the file (its one ``sh`` block under
"By hand, against upstream"), with the stand-ins it names for upstream's pieces, and checked
against what its comments say: three jobs of our reference module succeed on upstream's SDK
bundled beside its scripts, on one service loaded once, and upstream's example modules pass
`check` and preview. So the document cannot drift from what works.

The bundled SDK here is the stand-in with one line added: each process that imports it records
so in a file of its own, so that the test sees which copy every op, the daemon and the runner
used (the recipe itself needs no such line)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from harness_test_helpers import REPO

DOC = REPO / "docs" / "interop.md"
STANDIN = REPO / "sdk" / "tests" / "upstream_standin" / "oarbank_sdk"
# Appended to the bundled copy: who imported it (a runner writes only its workdir, ops and the
# daemon the module's data dir). Written aside and renamed: a process the agent ends while it
# writes (the runner's `doctor --json` in flight when the agent stops) leaves no empty mark.
MARK = '''
import os as _os
_where = _os.environ.get("OARBANK_WORKDIR") or _os.environ.get("OARBANK_MODULE_DATA")
if _where:
    _aside = _os.path.join(_where, f"mark-aside-{_os.getpid()}")
    with open(_aside, "w") as _f:
        _f.write(__file__)
    _os.replace(_aside, _os.path.join(_where, f"bundled-sdk-{_os.getpid()}"))
'''


def recipe() -> str:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## By hand, against upstream", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) == 1, f"{DOC}: expected one sh block in 'By hand', found {len(blocks)}"
    return blocks[0]


def test_the_by_hand_recipe_runs_as_written(tmp_path: Path) -> None:
    sdk = tmp_path / "marked" / "oarbank_sdk"
    shutil.copytree(STANDIN, sdk, ignore=shutil.ignore_patterns("__pycache__"))
    with open(sdk / "__init__.py", "a") as f:
        f.write(MARK)
    work = tmp_path / "w"
    work.mkdir()
    script = recipe().replace("W=$(mktemp -d)", f"W={work}", 1)
    bin_dir = str(Path(sys.executable).parent)  # our oarbank-agent, -sdk and -portal
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
           "UPSTREAM_SDK": str(sdk)}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    log = (work / "agent.log").read_text() if (work / "agent.log").exists() else ""
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- agent log\n{log[-3000:]}"

    # 1. Three jobs succeeded, on one service loaded once, every process on the bundled copy.
    jobs = [json.loads((work / f"job{i}.json").read_text()) for i in (1, 2, 3)]
    assert [j["state"] for j in jobs] == ["succeeded"] * 3, jobs
    assert [j["result"]["payload"]["texts"] for j in jobs][0] and \
        {j["result"]["provenance"]["loads"] for j in jobs} == {1}, jobs
    assert "succeeded" in done.stdout  # the status it printed
    marks = list(work.rglob("bundled-sdk-*"))
    assert {m.read_text() for m in marks} == {str(work / "mod" / "oarbank_sdk" / "__init__.py")}
    data_marks = [m for m in marks if "/modules/" in str(m)]  # ops and the daemon
    run_marks = [m for m in marks if "/jobs/" in str(m)]  # the runners
    assert len(run_marks) >= 3 and len(data_marks) >= 2, [str(m) for m in marks]

    # 2. Each upstream example module passed check (exit 0 under set -e) and previewed.
    modules = sorted(p.name for p in (REPO / "sdk/tests/manifests/upstream").iterdir()
                     if p.is_dir())
    assert done.stdout.count("ok") >= len(modules)
    for name in modules:
        assert list((work / "preview" / name).glob("*.html")), f"no preview of {name}"
