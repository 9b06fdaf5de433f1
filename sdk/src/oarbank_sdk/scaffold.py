"""``oarbank-sdk new DIR --id ID --service NAME --stage NAME``: a module from the reference.

The reference module (``examples/modelserver``) is copied with every name set consistently;
nothing else changes, so the new module passes ``check`` and ``conform`` as generated. The
places each name lives are the ones the example README's "Make it yours" lists: the manifest
(id, service, pool, stage, exec file names), ``SERVICE`` and ``PATH`` in the two scripts,
``conformance.json``, goldens, pages, panels and fixtures.

Each edit must find exactly what the reference holds; if the reference changed under it the
command fails naming the edit, never writing a half-renamed module. Public API:
``new_module(dest, module_id, service, stage, template=None) -> list[Path]``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

__all__ = ["TEMPLATE", "ScaffoldError", "new_module", "find_template"]

# The reference module, beside the SDK in a checkout of the repository.
TEMPLATE = Path(__file__).resolve().parents[3] / "examples" / "modelserver"
REF_ID, REF_SERVICE, REF_STAGE = "dev.example.modelserver", "model", "generate"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_ID = re.compile(r"^[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*)+$")


class ScaffoldError(Exception):
    """The module cannot be made; the message says why."""


def find_template(template: Path | None) -> Path:
    path = template if template is not None else TEMPLATE
    if not (path / "oarbank-module.toml").is_file():
        raise ScaffoldError(f"no reference module at {path}: pass --from PATH (examples/"
                            "modelserver of an oarbank checkout)")
    return path


def _check_names(module_id: str, service: str, stage: str) -> None:
    if not _ID.match(module_id):
        raise ScaffoldError(f"--id {module_id!r}: a reverse-DNS id you own, like com.acme.scorer")
    for flag, value in (("--service", service), ("--stage", stage)):
        if not _NAME.match(value):
            raise ScaffoldError(f"{flag} {value!r}: lower-case letters, digits and _, starting "
                                "with a letter (it becomes OARBANK_SERVICE_<NAME>)")


def _edit(text: str, file: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        if text.count(old) != 1:
            raise ScaffoldError(f"the reference {file} no longer holds {old!r} exactly once: "
                                "update oarbank_sdk.scaffold with it")
        text = text.replace(old, new)
    return text


def _walk(value: Any, fn: Any) -> Any:
    """``value`` with ``fn(key, v)`` applied to every string value (key: its dict key)."""
    if isinstance(value, dict):
        return {k: (fn(k, v) if isinstance(v, str) else _walk(v, fn)) for k, v in value.items()}
    if isinstance(value, list):
        return [fn(None, v) if isinstance(v, str) else _walk(v, fn) for v in value]
    return value


def _json(path: Path, fn: Any) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps(_walk(doc, fn), indent=2, ensure_ascii=False) + "\n",
                    encoding="utf-8")


def new_module(dest: Path, module_id: str, service: str, stage: str,
               template: Path | None = None) -> list[Path]:
    """Write the module into ``dest`` (new or empty); returns the files written."""
    _check_names(module_id, service, stage)
    src = find_template(template)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ScaffoldError(f"{dest} exists and is not an empty folder")
    svc_file, run_file = f"{service}_service.py", f"{stage}_runner.py"
    path = f"/v1/{stage}"
    title = f"{service.replace('_', ' ').capitalize()} service"
    staging = dest.with_name(f".{dest.name}.new")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(src, staging, ignore=shutil.ignore_patterns("__pycache__", "README.md"))
    try:
        _rename(staging, module_id, service, stage, svc_file, run_file, path, title)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if dest.exists():
        dest.rmdir()
    staging.rename(dest)
    return sorted(p for p in dest.rglob("*") if p.is_file())


def _rename(d: Path, module_id: str, service: str, stage: str, svc_file: str, run_file: str,
            path: str, title: str) -> None:
    toml = d / "oarbank-module.toml"
    toml.write_text(_edit(toml.read_text(encoding="utf-8"), "oarbank-module.toml", [
        (f'id = "{REF_ID}"', f'id = "{module_id}"'),
        ('description = "A stand-in model loaded once per node in a warm service; generate jobs '
         'send it prompts"',
         f'description = "The {service} service, loaded once per node; {stage} jobs use it"'),
        ('"{bundle}/model_runner.py"', f'"{{bundle}}/{run_file}"'),
        (f'name = "{REF_SERVICE}"', f'name = "{service}"'),
        ('"{bundle}/model_service.py"', f'"{{bundle}}/{svc_file}"'),
        (f'provides = {{ pools = ["{REF_SERVICE}"] }}', f'provides = {{ pools = ["{service}"] }}'),
        (f'name = "{REF_STAGE}"', f'name = "{stage}"'),
        (f"requires.pools = {{ {REF_SERVICE} = 1 }}", f"requires.pools = {{ {service} = 1 }}"),
        ("fingerprint.pools.model", f"fingerprint.pools.{service}"),
        ("OARBANK_SERVICE_MODEL", f"OARBANK_SERVICE_{service.upper()}"),
        ('title = "Model service"\n', f'title = "{title}"\n'),
        ('title = "Model service on this node"', f'title = "{title} on this node"'),
    ]), encoding="utf-8")
    for old, new in (("model_service.py", svc_file), ("model_runner.py", run_file)):
        code = (d / old).read_text(encoding="utf-8")
        (d / old).unlink()
        (d / new).write_text(_edit(code, old, [
            (f'SERVICE = "{REF_SERVICE}"', f'SERVICE = "{service}"'),
            ('PATH = "/v1/generate"', f'PATH = "{path}"'),
        ]), encoding="utf-8")

    def names(key: str | None, v: str) -> str:
        if key == "service" and v == REF_SERVICE:
            return service  # params.service, service_specs[].service, fixture rows
        if key in ("stage", "name") and v == REF_STAGE:
            return stage  # goldens; the spec named after the stage
        if key == "path" and v.startswith("/v1/generate"):
            return path + v[len("/v1/generate"):]
        return v.replace("Model service", title).replace("model service", title.lower())

    for f in (d / "conformance.json", *sorted((d / "goldens").glob("*.json")),
              *sorted((d / "ui").rglob("*.json")), *sorted((d / "fixtures").rglob("*.json"))):
        _json(f, names)
    (d / "README.md").write_text(_readme(module_id, service, stage, svc_file, run_file, path),
                                 encoding="utf-8")


def _readme(module_id: str, service: str, stage: str, svc_file: str, run_file: str,
            path: str) -> str:
    return f"""# {module_id}

Made by `oarbank-sdk new` from the reference module (examples/modelserver in the oarbank
repository; its README explains every file, op and timing). The service `{service}` is still
the stand-in model: replace `load_model` and `complete` in `{svc_file}` with the real thing,
keeping the order hello (`Acceptor()`), load, ready marker, `acc.ready()` where the SDK has
it (jobs start at once where the agent offers it; elsewhere the agent polls `ready`),
`serve_http`. Both scripts run on upstream's SDK too: use what only ours has (`ready`) only
after looking it up, as `{svc_file}` does.

Where the names live (change them together):

- module id `{module_id}`: `[module] id` in `oarbank-module.toml`;
- service `{service}`: `[[services]] name`, `provides.pools`, the stage's `requires.pools`,
  `SERVICE` in `{svc_file}` (the fingerprint's `pools`) and in `{run_file}`
  (`OARBANK_SERVICE_{service.upper()}`), `conformance.json` `service`, `ui/pages`,
  `ui/panels` (`params.service`), `fixtures/ui/queries/services.json`;
- stage `{stage}`: `[[stages]] name`, each golden's `stage`, and the HTTP path `{path}`
  (`PATH` in both scripts, `conformance.json` `path`).

```sh
oarbank-sdk check .
oarbank-sdk conform .
```
"""
