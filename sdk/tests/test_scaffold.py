"""`oarbank-sdk new`: a module from the reference example with every name set, which passes
`check` and `conform` as generated (real commands, a real conform run)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from platform_marks import conform_kit  # sdk/tests

from oarbank_sdk import conform, manifest

ROOT = Path(__file__).resolve().parents[2]


pytestmark = conform_kit


def sdk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oarbank_sdk", *args], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_a_new_module_passes_check_and_conform_with_every_name_set(tmp_path):
    dest = tmp_path / "sentiment"
    made = sdk("new", str(dest), "--id", "com.acme.sentiment", "--service", "scorer",
               "--stage", "score")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith(f"{dest}: com.acme.sentiment with service 'scorer' and stage "
                                  "'score' (13 files)")
    checked = sdk("check", str(dest))
    assert checked.stdout.strip() == f"{dest}: ok com.acme.sentiment 0.1.0", checked.stdout

    m = manifest.load(dest)
    assert [s.name for s in m.services] == ["scorer"]
    assert m.services[0].pools == ("scorer",)
    assert [(s.name, dict(s.pools)) for s in m.stages] == [("score", {"scorer": 1})]
    assert m.runner is not None and m.runner.exec[-1] == "{bundle}/score_runner.py"
    assert m.services[0].exec[-1] == "{bundle}/scorer_service.py"
    assert 'SERVICE = "scorer"' in (dest / "score_runner.py").read_text()
    assert 'PATH = "/v1/score"' in (dest / "scorer_service.py").read_text()
    for f in dest.rglob("*.json"):  # no service, stage or path of the reference left
        text = f.read_text()
        assert '"model"' not in text and '"generate"' not in text, f
        assert "/v1/generate" not in text, f
    goldens = [json.loads(g.read_text()) for g in (dest / "goldens").glob("*.json")]
    assert {g["stage"] for g in goldens} == {"score"}

    out = io.StringIO()
    rc = conform.run(dest, json_output=True, sandbox=False, stream=out)
    report = json.loads(out.getvalue())
    assert rc == 0, [c for c in report["checks"] if c["status"] == "FAIL"]
    names = {c["name"] for c in report["checks"] if c["status"] == "ok"}
    assert {"service scorer: fingerprint", "service scorer: hello", "service scorer: ready",
            "golden hello", "golden several_prompts", "spec score"} <= names, names


def test_bad_names_and_a_used_folder_are_refused_with_exit_2(tmp_path):
    for flag, value, says in (("--id", "Sentiment", "a reverse-DNS id you own"),
                              ("--service", "Scorer-1", "--service 'Scorer-1': lower-case"),
                              ("--stage", "1score", "--stage '1score': lower-case")):
        args = {"--id": "com.acme.s", "--service": "scorer", "--stage": "score", flag: value}
        r = sdk("new", str(tmp_path / "m"), *[x for kv in args.items() for x in kv])
        assert r.returncode == 2 and says in r.stderr, r.stderr
        assert not (tmp_path / "m").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    r = sdk("new", str(tmp_path / "used"), "--id", "com.acme.s", "--service", "s", "--stage", "t")
    assert r.returncode == 2 and "exists and is not an empty folder" in r.stderr
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["keep.txt"]


def test_the_example_readme_lists_every_place_a_name_lives():
    readme = (ROOT / "examples" / "modelserver" / "README.md").read_text()
    section = readme.split("## Make it yours", 1)[1].split("\n## ", 1)[0]
    for place in ("[module] id", "[[services]] name", "provides.pools", "requires.pools",
                  "SERVICE", "PATH", "OARBANK_SERVICE_", "conformance.json", "goldens/",
                  "ui/pages/", "ui/panels/", "fixtures/ui/queries/services.json", "exec",
                  "oarbank-sdk new"):
        assert place in section, place
