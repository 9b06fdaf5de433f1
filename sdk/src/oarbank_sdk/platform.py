"""Which platform this is, per-platform tables and placement classes, by upstream's names
(``from oarbank_sdk import platform as pf``). Standard library only: runners import it.

    pf.current()          # "linux-amd64": OARBANK_PLATFORM when well formed, else this machine
    pf.os_(), pf.arch()   # "linux", "amd64"
    pf.resolve({"linux": 2, "linux-arm64": 3}, "linux-amd64", default=1)   # 2
    pf.class_key("linux-amd64", "same-os")                                 # "linux"

Resolution: a token's own entry wins over its OS's, which wins over the default. Mixes (how
far a unit of work may spread): ``any`` < ``same-os``/``same-arch`` < ``same-platform``; an
unknown mix is treated as the strictest, an absent one as ``any``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import portable

__all__ = ["ENV_PLATFORM", "MERGED", "MIXES", "SCOPE_MIX", "STRICTEST", "apply_variants",
           "arch", "class_key", "current", "declared", "feasible", "feasible_classes", "is_key",
           "known_mix", "looser", "matches", "normalize", "os_", "overlay", "resolve",
           "scope_mix", "stricter", "strictness", "variant_keys"]

ENV_PLATFORM = "OARBANK_PLATFORM"


def current() -> str:
    """The platform this process runs for: ``OARBANK_PLATFORM`` when it is a token (agents
    set it for runners and services), else this machine's (``portable.host_platform``)."""
    value = os.environ.get(ENV_PLATFORM, "")
    return value if portable.is_platform_token(value) else portable.host_platform()


def os_(token: str | None = None) -> str:
    """The OS part of ``token`` (default: ``current()``)."""
    return portable.split_platform(token or current())[0]


def arch(token: str | None = None) -> str:
    """The architecture part of ``token`` (default: ``current()``)."""
    return portable.split_platform(token or current())[1]


def is_key(key: object) -> bool:
    """Whether ``key`` may key a per-platform table: a token or an OS name."""
    return isinstance(key, str) and portable.PLATFORM_KEY.fullmatch(key) is not None


def matches(token: str, keys: Iterable[str] | None) -> bool:
    """Whether ``keys`` (tokens or OS names) admit ``token``; no keys admit every platform."""
    listed = list(keys or ())
    return not listed or token in listed or portable.split_platform(token)[0] in listed


def declared(key: str, tokens: Iterable[str]) -> bool:
    """Whether ``key`` names one of ``tokens`` or the OS of one."""
    pool = set(tokens)
    return key in pool or key in {portable.split_platform(t)[0] for t in pool}


def variant_keys(token: str) -> tuple[str, str]:
    """The table keys that apply to ``token``, least specific first: ``(os, token)``."""
    return portable.split_platform(token)[0], token


def resolve(mapping: Mapping[str, Any] | None, token: str, default: Any = None) -> Any:
    """``mapping[token]``, else ``mapping[os]``, else ``default``."""
    table = mapping or {}
    for key in reversed(variant_keys(token)):
        if key in table:
            return table[key]
    return default


# Fields a variant merges into the base name by name; every other field it replaces whole.
MERGED = ("env", "timeouts_s", "requires", "requires.resources")


def overlay(base: Mapping[str, Any], *layers: Mapping[str, Any] | None,
            merged: Sequence[str] = MERGED, _path: str = "") -> dict[str, Any]:
    """``base`` with each layer laid over it in turn (tables in ``merged`` key by key)."""
    out = dict(base)
    for layer in layers:
        for key, value in (layer or {}).items():
            dotted = _path + key
            if dotted in merged and isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
                out[key] = overlay(out[key], value, merged=merged, _path=dotted + ".")
            else:
                out[key] = value
    return out


def apply_variants(base: Mapping[str, Any], variants: Mapping[str, Any] | None,
                   token: str) -> dict[str, Any]:
    """A section as ``token`` sees it: the OS's variant, then the token's, over ``base``."""
    table = variants or {}
    return overlay(base, *[table[k] for k in variant_keys(token) if k in table])


MIXES = ("any", "same-os", "same-arch", "same-platform")
STRICTEST = "same-platform"
SCOPE_MIX = {"global": "any", "os": "same-os", "arch": "same-arch", "platform": "same-platform"}
_STRICTNESS = {"any": 0, "same-os": 1, "same-arch": 1, "same-platform": 2}


def known_mix(mix: object) -> bool:
    return mix in MIXES


def normalize(mix: str | None) -> str:
    """None -> ``any``; an unknown mix -> the strictest (the safe reading)."""
    if mix is None:
        return "any"
    return mix if mix in MIXES else STRICTEST


def scope_mix(scope: str | None) -> str:
    """The mix a ``results.determinism_scope`` implies (none: ``global``; unknown: strictest)."""
    return SCOPE_MIX.get(scope or "global", STRICTEST)


def class_key(token: str, mix: str | None) -> str:
    """The class ``token`` falls in under ``mix``: ``*``, its OS, its arch or itself."""
    os_name, arch_name = portable.split_platform(token)
    return {"any": "*", "same-os": os_name, "same-arch": arch_name}.get(normalize(mix), token)


def strictness(mix: str | None) -> int:
    """0 (any), 1 (same-os or same-arch, not comparable to each other), 2 (same-platform)."""
    return _STRICTNESS[normalize(mix)]


def stricter(a: str | None, b: str | None) -> str:
    """The loosest mix that satisfies both (same-os with same-arch: same-platform)."""
    a, b = normalize(a), normalize(b)
    if a == b:
        return a
    if strictness(a) != strictness(b):
        return a if strictness(a) > strictness(b) else b
    return STRICTEST


def looser(a: str | None, b: str | None) -> bool:
    """Whether mix ``a`` lets a unit spread across classes that ``b`` keeps apart."""
    return stricter(a, b) != normalize(a)


def feasible_classes(platforms: Iterable[str], stage_platforms: Iterable[Iterable[str]] = (),
                     job_platforms: Iterable[str] = (), mix: str | None = None) -> list[str]:
    """The sorted classes (under ``mix``) of the ``platforms`` that every list of
    ``stage_platforms`` and ``job_platforms`` admit (an empty list admits all)."""
    stage_lists = [list(s) for s in stage_platforms]
    job = list(job_platforms)
    ok = [p for p in dict.fromkeys(platforms)
          if all(matches(p, s) for s in stage_lists) and matches(p, job)]
    return sorted({class_key(p, mix) for p in ok})


def feasible(manifest: Any, stages: Iterable[str] | None = None, *,
             platforms: Iterable[str] = (), mix: str | None = None) -> list[str]:
    """``feasible_classes`` for a manifest (``oarbank_sdk.manifest.Manifest``): ``stages``
    (default: all) are the stages the unit runs, ``platforms`` the job's, ``mix`` defaults to
    the manifest's ``[placement].mix``. ``ValueError`` names stages the manifest lacks."""
    by_name = {s.name: s for s in manifest.stages}
    names = list(stages) if stages else list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown stages {unknown} (the manifest has {sorted(by_name)})")
    raw = manifest.raw if isinstance(getattr(manifest, "raw", None), dict) else {}
    if mix is None:
        placement = raw.get("placement")
        mix = placement.get("mix", "any") if isinstance(placement, dict) else "any"
    requires = raw.get("requires")
    module_platforms = requires.get("platforms", ()) if isinstance(requires, dict) else ()
    return feasible_classes(module_platforms, [by_name[n].platforms for n in names],
                            platforms, mix)
