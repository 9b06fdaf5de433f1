"""oarbank_sdk.manifest: loading real files, defaults, and every error contract section 1 lists."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oarbank_sdk import manifest as m

SEED = Path(__file__).parent / "manifests" / "seed"

# A small valid manifest; the error cases below each change one thing in it.
BASE = """\
manifest = 1

[module]
id = "dev.example.test"
version = "1.0"

[requires]
core = ">=2.5,<3"
service_protocol = [1]

[runner]
exec = ["python", "-I", "{bundle}/runner.py"]

[[stages]]
name = "generate"
requires.pools = { model = 1 }

[[services]]
name = "model"
exec = ["python", "-I", "{bundle}/svc.py"]
endpoint = true
provides = { pools = ["model"] }
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / m.MANIFEST_FILE).write_text(text, encoding="utf-8")
    return tmp_path


def problems(tmp_path: Path, text: str) -> dict[str, str]:
    found, probs = m.check(write(tmp_path, text))
    assert found is None, "expected the manifest to be invalid"
    assert probs
    return {p.key: p.message for p in probs}


def edit(old: str, new: str, text: str = BASE) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


SVC_LINE = 'provides = { pools = ["model"] }'
STAGE_POOLS = "requires.pools = { model = 1 }"


# -- valid manifests --------------------------------------------------------------------------


def test_base_manifest_is_valid_and_defaults_apply(tmp_path: Path) -> None:
    man = m.load(write(tmp_path, BASE))
    assert man.id == "dev.example.test" and man.version == "1.0" and man.description == ""
    assert man.short_name == "test"
    assert man.path == tmp_path / m.MANIFEST_FILE
    assert man.bundle == tmp_path.resolve() and man.bundle.is_absolute()
    svc = man.service("model")
    assert svc == m.Service(name="model", exec=("python", "-I", "{bundle}/svc.py"),
                            endpoint=True, pools=("model",))
    assert svc.lifecycle == "on_demand" and svc.idle_timeout_s == 900
    assert (svc.start_timeout_s, svc.stop_timeout_s) == (120, 120)
    assert svc.restart == m.Restart(backoff_initial_s=10, backoff_max_s=600, max_failures=5)
    assert svc.gpu == m.Gpu(use="none", apis_any=())
    assert svc.yieldable is True and svc.reserves_host_memory is False
    assert svc.env_name == "OARBANK_SERVICE_MODEL"
    stage = man.stage("generate")
    assert stage is not None
    assert stage.timeout_s == 1800 and stage.max_attempts == 3
    assert stage.pools == {"model": 1} and stage.needs_pools == ()
    assert stage.cpu is None and stage.mem_gb is None
    assert man.runner == m.Runner(exec=("python", "-I", "{bundle}/runner.py"), env={},
                                  stop_grace_s=20)
    assert man.service_for_pool("model") is svc
    assert man.service_for_pool("other") is None and man.stage("x") is None
    assert man.pages == () and man.panels == () and man.sandbox == {}


def test_seed_like_manifest_loads_every_field() -> None:
    man = m.load(SEED / m.MANIFEST_FILE)  # the toml path works as well as the folder
    assert man.id == "dev.example.modelserver"
    svc = man.services[0]
    assert svc.idle_timeout_s == 600 and svc.start_timeout_s == 30
    assert svc.restart == m.Restart(1, 30, 3)
    assert svc.reserves_host_memory and svc.endpoint and svc.pools == ("model",)
    stage = man.stages[0]
    assert (stage.timeout_s, stage.cpu, stage.mem_gb, stage.max_attempts) == (60, 1, 0.5, 2)
    assert man.runner is not None and man.runner.env == {"MODEL_NAME": "tiny"}
    assert man.runner.stop_grace_s == 5
    assert man.pages == (m.UiEntry("overview", "Model server", "module", "ui/pages/overview.json"),)
    assert man.panels[0].slot == "node"
    assert man.raw["coordinator"] == {"anything": "goes"}


def test_reference_module_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "modelserver"
    if not (example / m.MANIFEST_FILE).exists():
        pytest.fail("examples/modelserver/oarbank-module.toml is missing")
    assert m.load(example).id == "dev.example.modelserver"


def test_passed_over_sections_are_accepted_unread(tmp_path: Path) -> None:
    text = BASE + """
[coordinator]
shards = 4
[results]
keep_days = 30
[goldens]
dir = "goldens"
[[operations]]
name = "reindex"
whatever = { nested = true }
[[probes]]
name = "disk"
[datasets]
main = "s3://bucket"
[cli]
commands = ["x"]
[some_future_section]
anything = 1
"""
    man = m.load(write(tmp_path, text))
    assert man.raw["operations"][0]["name"] == "reindex"


def test_gpu_service_with_compute_sandbox_is_valid(tmp_path: Path) -> None:
    text = edit(SVC_LINE, SVC_LINE + '\ngpu = { use = "shared", apis_any = ["metal", "cuda"] }')
    text += '\n[sandbox]\ndevices = { gpu = "compute" }\nnet = "none"\n'
    man = m.load(write(tmp_path, text))
    assert man.services[0].gpu == m.Gpu("shared", ("metal", "cuda"))
    assert man.sandbox["devices"] == {"gpu": "compute"}


@pytest.mark.parametrize("core", [">=2.5,<3", ">=2.5", ">2.5", "~=2.6", ">=3.0,<4", "==2.7.*"])
def test_core_ranges_at_or_above_2_5_allow_endpoint(tmp_path: Path, core: str) -> None:
    m.load(write(tmp_path, edit('core = ">=2.5,<3"', f'core = "{core}"')))


def test_exec_may_start_with_a_bundle_path(tmp_path: Path) -> None:
    text = edit('exec = ["python", "-I", "{bundle}/svc.py"]', 'exec = ["{bundle}/bin/svc"]')
    assert m.load(write(tmp_path, text)).services[0].exec == ("{bundle}/bin/svc",)


def test_expand_exec(tmp_path: Path) -> None:
    argv = ["python", "-I", "{bundle}/svc.py", "--data={bundle}/d", "{other}"]
    out = m.expand_exec(argv, tmp_path)
    root = str(tmp_path.resolve())
    assert out == [sys.executable, "-I", f"{root}/svc.py", f"--data={root}/d", "{other}"]
    assert m.expand_exec(["{bundle}/run", "python"], tmp_path, python="/x/py") == [
        f"{root}/run", "python"]
    assert argv[0] == "python"  # the input is not modified


# -- the errors the contract lists ------------------------------------------------------------

CASES = [
    # (id, manifest text, key, part of the message)
    ("endpoint-without-pool", edit(STAGE_POOLS, "", edit(SVC_LINE, "provides = { pools = [] }")),
     "services[0].endpoint", "provide at least one pool"),
    ("endpoint-no-provides", edit(STAGE_POOLS, "", edit(SVC_LINE, "")),
     "services[0].endpoint", "provide at least one pool"),
    ("endpoint-manual", edit(SVC_LINE, SVC_LINE + '\nlifecycle = "manual"'),
     "services[0].lifecycle", 'cannot be "manual"'),
    ("gpu-without-sandbox", edit(SVC_LINE, SVC_LINE + '\ngpu = { use = "exclusive" }'),
     "services[0].gpu.use", 'devices.gpu = "compute"'),
    ("gpu-sandbox-not-compute",
     edit(SVC_LINE, SVC_LINE + '\ngpu = { use = "shared" }') + '[sandbox]\ndevices.gpu = "none"\n',
     "services[0].gpu.use", 'devices.gpu = "compute"'),
    ("apis-any-with-use-none", edit(SVC_LINE, SVC_LINE + '\ngpu = { apis_any = ["cuda"] }'),
     "services[0].gpu.apis_any", 'use = "none"'),
    ("stage-pool-not-provided", edit(STAGE_POOLS, "requires.pools = { model = 1, disk = 2 }"),
     "stages[0].requires.pools.disk", 'no service provides pool "disk"'),
    ("needs-pool-not-provided", edit(STAGE_POOLS, STAGE_POOLS + '\nrequires.needs_pools = ["gpu"]'),
     "stages[0].requires.needs_pools[0]", 'no service provides pool "gpu"'),
    ("duplicate-stage", BASE + '[[stages]]\nname = "generate"\n',
     "stages[1].name", 'duplicate stage name "generate"'),
    ("duplicate-service",
     BASE + '[[services]]\nname = "model"\nexec = ["python"]\nprovides = { pools = ["m2"] }\n',
     "services[1].name", 'duplicate service name "model"'),
    ("no-service-protocol", edit("service_protocol = [1]\n", ""),
     "requires.service_protocol", "required"),
    ("empty-service-protocol", edit("service_protocol = [1]", "service_protocol = []"),
     "requires.service_protocol", "non-empty"),
    ("core-below-2.5", edit('core = ">=2.5,<3"', 'core = ">=2.4,<3"'),
     "services[0].endpoint", "at least 2.5"),
    ("core-exclusive-2.4", edit('core = ">=2.5,<3"', 'core = ">2.4"'),
     "services[0].endpoint", "at least 2.5"),
    ("core-upper-only", edit('core = ">=2.5,<3"', 'core = "<3"'),
     "services[0].endpoint", "at least 2.5"),
    ("core-missing-with-endpoint", edit('core = ">=2.5,<3"\n', ""),
     "services[0].endpoint", "requires.core is missing"),
    ("core-low-with-gpu",
     edit('core = ">=2.5,<3"', 'core = ">=2.0"',
          edit("endpoint = true\n", "", edit(STAGE_POOLS, "",
               edit(SVC_LINE, 'gpu = { use = "none" }')))),
     "services[0].gpu", "at least 2.5"),
    ("core-not-a-range", edit('core = ">=2.5,<3"', 'core = "two point five"'),
     "requires.core", "not a version clause"),
    ("unknown-key-service", edit(SVC_LINE, SVC_LINE + '\ncolour = "red"'),
     "services[0].colour", "unknown key"),
    ("unknown-key-module", edit('version = "1.0"', 'version = "1.0"\nauthor = "me"'),
     "module.author", "unknown key"),
    ("unknown-key-requires", edit("service_protocol = [1]", "service_protocol = [1]\npython = 3"),
     "requires.python", "unknown key"),
    ("unknown-key-runner", edit("[runner]", "[runner]\nshell = true"),
     "runner.shell", "unknown key"),
    ("unknown-key-stage", edit('name = "generate"', 'name = "generate"\nprio = 1'),
     "stages[0].prio", "unknown key"),
    ("unknown-key-stage-requires", edit(STAGE_POOLS, STAGE_POOLS + "\nrequires.gpus = 1"),
     "stages[0].requires.gpus", "unknown key"),
    ("unknown-key-resources", edit(STAGE_POOLS, STAGE_POOLS + "\nrequires.resources.disk_gb = 1"),
     "stages[0].requires.resources.disk_gb", "unknown key"),
    ("unknown-key-retry", edit(STAGE_POOLS, STAGE_POOLS + "\nretry.delay_s = 1"),
     "stages[0].retry.delay_s", "unknown key"),
    ("unknown-key-restart", edit(SVC_LINE, SVC_LINE + "\nrestart = { jitter = 1 }"),
     "services[0].restart.jitter", "unknown key"),
    ("unknown-key-provides", edit(SVC_LINE, 'provides = { pools = ["model"], slots = 1 }'),
     "services[0].provides.slots", "unknown key"),
    ("unknown-key-gpu", edit(SVC_LINE, SVC_LINE + '\ngpu = { use = "none", vram_gb = 8 }'),
     "services[0].gpu.vram_gb", "unknown key"),
    ("unknown-key-ui-entry",
     edit("service_protocol = [1]", 'service_protocol = [1]\nui_contract = ">=1.2"')
     + '[ui]\npages = [{ id = "o", file = "o.json", icon = "x" }]\n',
     "ui.pages[0].icon", "unknown key"),
    ("ui-pages-not-array",
     edit("service_protocol = [1]", 'service_protocol = [1]\nui_contract = ">=1.2"')
     + '[ui]\npages = "overview.json"\n',
     "ui.pages", "expected an array of tables"),
    ("stage-after-wrong-type", edit(STAGE_POOLS, STAGE_POOLS + "\nafter = [1]"),
     "stages[0].after[0]", "expected a string"),
    ("unknown-key-ui", BASE + "[ui]\nwidgets = []\n", "ui.widgets", "unknown key"),
    ("unknown-key-devices", BASE + '[sandbox]\ndevices = { camera = "on" }\n',
     "sandbox.devices.camera", "unknown key"),
    ("unknown-top-level-value", "color = 1\n" + BASE, "color", "unknown key"),
    ("timeout-wrong-type", edit(SVC_LINE, SVC_LINE + '\nidle_timeout_s = "10m"'),
     "services[0].idle_timeout_s", 'expected a positive number of seconds, got a string ("10m")'),
    ("endpoint-wrong-type", edit("endpoint = true", 'endpoint = "yes"'),
     "services[0].endpoint", 'expected true or false, got a string ("yes")'),
    ("exec-wrong-type", edit('exec = ["python", "-I", "{bundle}/svc.py"]', 'exec = "python svc.py"'),
     "services[0].exec", "expected a list of strings, got a string"),
    ("exec-element-wrong-type", edit('"-I", "{bundle}/svc.py"', '"-I", 3'),
     "services[0].exec[2]", "expected a string, got an integer (3)"),
    ("pool-count-wrong-type", edit(STAGE_POOLS, 'requires.pools = { model = "1" }'),
     "stages[0].requires.pools.model", "expected a positive integer, got a string"),
    ("pool-count-zero", edit(STAGE_POOLS, "requires.pools = { model = 0 }"),
     "stages[0].requires.pools.model", "positive integer"),
    ("pool-count-float", edit(STAGE_POOLS, "requires.pools = { model = 1.5 }"),
     "stages[0].requires.pools.model", "expected a positive integer, got a number (1.5)"),
    ("version-wrong-type", edit('version = "1.0"', "version = 1"),
     "module.version", "expected a string, got an integer (1)"),
    ("module-not-table", edit('[module]\nid = "dev.example.test"\nversion = "1.0"\n',
                              'module = "dev.example.test"\n'),
     "module", "expected a table"),
    ("stages-not-array", 'stages = "generate"\n' + edit(
        '[[stages]]\nname = "generate"\n' + STAGE_POOLS + "\n", ""),
     "stages", "expected an array of tables"),
    ("runner-env-value", edit("[runner]", "[runner]\nenv = { DEBUG = 1 }"),
     "runner.env.DEBUG", "expected a string, got an integer (1)"),
    ("manifest-2", edit("manifest = 1", "manifest = 2"), "manifest", "manifest = 1"),
    ("manifest-string", edit("manifest = 1", 'manifest = "1"'), "manifest", "got a string"),
    ("manifest-missing", edit("manifest = 1\n", ""), "manifest", "missing"),
    ("module-id-not-reverse-dns", edit('id = "dev.example.test"', 'id = "modelserver"'),
     "module.id", "reverse-DNS"),
    ("module-id-upper", edit('id = "dev.example.test"', 'id = "Dev.Example.Test"'),
     "module.id", "reverse-DNS"),
    ("module-id-missing", edit('id = "dev.example.test"\n', ""), "module.id", "missing"),
    ("service-name-upper", edit('name = "model"', 'name = "Model"'),
     "services[0].name", "^[a-z][a-z0-9_]*$"),
    ("service-name-dash", edit('name = "model"', 'name = "model-x"'),
     "services[0].name", "^[a-z][a-z0-9_]*$"),
    ("service-name-digit", edit('name = "model"', 'name = "1model"'),
     "services[0].name", "^[a-z][a-z0-9_]*$"),
    ("service-name-missing", edit('name = "model"\n', ""), "services[0].name", "missing"),
    ("lifecycle-enum", edit(SVC_LINE, SVC_LINE + '\nlifecycle = "sometimes"'),
     "services[0].lifecycle", '"sometimes" is not one of "on_demand", "always", "manual"'),
    ("gpu-use-enum", edit(SVC_LINE, SVC_LINE + '\ngpu = { use = "all" }'),
     "services[0].gpu.use", '"all" is not one of "none", "shared", "exclusive"'),
    ("apis-any-value",
     edit(SVC_LINE, SVC_LINE + '\ngpu = { use = "shared", apis_any = ["cuda", "glide"] }')
     + '[sandbox]\ndevices.gpu = "compute"\n',
     "services[0].gpu.apis_any[1]", 'unknown GPU API "glide"'),
    ("platform-token", edit("service_protocol = [1]",
                            'service_protocol = [1]\nplatforms = ["linux-amd64", "linux-x86"]'),
     "requires.platforms[1]", 'unknown platform "linux-x86"'),
    ("service-platform-token", edit(SVC_LINE, SVC_LINE + '\nplatforms = ["macos"]'),
     "services[0].platforms[0]", 'unknown platform "macos"'),
    ("start-timeout-zero", edit(SVC_LINE, SVC_LINE + "\nstart_timeout_s = 0"),
     "services[0].start_timeout_s", "greater than 0"),
    ("stage-timeout-negative", edit(STAGE_POOLS, STAGE_POOLS + "\ntimeout_s = -5"),
     "stages[0].timeout_s", "greater than 0"),
    ("stop-grace-inf", edit("[runner]", "[runner]\nstop_grace_s = inf"),
     "runner.stop_grace_s", "expected a positive number"),
    ("max-failures-float", edit(SVC_LINE, SVC_LINE + "\nrestart = { max_failures = 2.5 }"),
     "services[0].restart.max_failures", "expected a positive integer"),
    ("max-attempts-zero", edit(STAGE_POOLS, STAGE_POOLS + "\nretry = { max_attempts = 0 }"),
     "stages[0].retry.max_attempts", "positive integer"),
    ("exec-0-absolute", edit('exec = ["python", "-I", "{bundle}/svc.py"]',
                             'exec = ["/usr/bin/python3", "svc.py"]'),
     "services[0].exec[0]", '"python"'),
    ("exec-0-bare-command", edit('exec = ["python", "-I", "{bundle}/runner.py"]',
                                 'exec = ["bash", "run.sh"]'),
     "runner.exec[0]", "{bundle}/<path>"),
    ("exec-empty", edit('exec = ["python", "-I", "{bundle}/svc.py"]', "exec = []"),
     "services[0].exec", "must not be empty"),
    ("exec-missing", edit('exec = ["python", "-I", "{bundle}/svc.py"]\n', ""),
     "services[0].exec", "missing"),
    ("ui-contract-missing-with-pages",
     BASE + '[ui]\npanels = [{ id = "node", title = "Node", slot = "node", file = "p.json" }]\n',
     "requires.ui_contract", "required when [ui] pages or panels"),
    ("ui-file-outside-bundle",
     edit("service_protocol = [1]", 'service_protocol = [1]\nui_contract = ">=1.2"')
     + '[ui]\npages = [{ id = "o", file = "../o.json" }]\n',
     "ui.pages[0].file", "relative to the bundle"),
]


@pytest.mark.parametrize(("text", "key", "fragment"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_each_listed_error_names_its_key(
    tmp_path: Path, text: str, key: str, fragment: str
) -> None:
    found = problems(tmp_path, text)
    assert key in found, f"no problem at {key}; got {found}"
    assert fragment in found[key]


def test_every_problem_is_reported_together(tmp_path: Path) -> None:
    text = edit('id = "dev.example.test"', 'id = "nodots"')
    text = edit("service_protocol = [1]\n", "", text)
    text = edit(SVC_LINE, SVC_LINE + '\nlifecycle = "manual"\ncolour = 1', text)
    text = edit(STAGE_POOLS, "requires.pools = { model = 1, disk = 1 }\ntimeout_s = 0", text)
    text += '[[stages]]\nname = "generate"\n'
    with pytest.raises(m.ManifestError) as info:
        m.load(write(tmp_path, text))
    keys = [p.key for p in info.value.problems]
    for key in ("module.id", "requires.service_protocol", "services[0].lifecycle",
                "services[0].colour", "stages[0].requires.pools.disk", "stages[0].timeout_s",
                "stages[1].name"):
        assert key in keys
    assert len(keys) == 7, keys
    lines = str(info.value).splitlines()
    assert lines[0] == f"{tmp_path / m.MANIFEST_FILE}: INVALID"
    assert len(lines) == 8 and all(": " in line for line in lines[1:])
    assert info.value.path == tmp_path / m.MANIFEST_FILE


def test_toml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    found = problems(tmp_path, 'manifest = 1\n[module\nid = "x.y"\n')
    assert len(found) == 1
    assert "line 2, column" in next(iter(found.values()))


def test_missing_file_and_folder(tmp_path: Path) -> None:
    man, probs = m.check(tmp_path)
    assert man is None and len(probs) == 1 and m.MANIFEST_FILE in probs[0].message
    man, probs = m.check(tmp_path / "nowhere" / m.MANIFEST_FILE)
    assert man is None and "does not exist" in probs[0].message
    with pytest.raises(m.ManifestError):
        m.load(tmp_path)


def test_not_utf8(tmp_path: Path) -> None:
    (tmp_path / m.MANIFEST_FILE).write_bytes(b"manifest = 1\n# \xff\xfe\n")
    man, probs = m.check(tmp_path)
    assert man is None and "UTF-8" in probs[0].message
