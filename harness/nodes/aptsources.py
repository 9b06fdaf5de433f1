"""Which Debian mirror to debootstrap from: read from this machine's apt configuration.

The repository never names a mirror host. At run time we parse `/etc/apt/sources.list`
(one-line format) and `/etc/apt/sources.list.d/*.list` / `*.sources` (deb822 format) and take
the first `deb` entry that serves the Debian main archive (a suite that is not `-security`).
Parsing is pure (text in, entries out) so it is tested without touching the machine's files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["AptSource", "parse_one_line", "parse_deb822", "read_sources", "debian_mirror"]


@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]


def parse_one_line(text: str) -> list[AptSource]:
    """`deb [opts] URI SUITE COMPONENT...` lines; `deb-src` and comments are skipped."""
    out: list[AptSource] = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        # Drop the optional `[arch=amd64 signed-by=...]` block.
        words = re.sub(r"\[[^\]]*\]", " ", line[4:]).split()
        if len(words) < 2:
            continue
        out.append(AptSource(words[0], (words[1],), tuple(words[2:])))
    return out


def parse_deb822(text: str) -> list[AptSource]:
    """Stanzas separated by blank lines, `Types:`, `URIs:`, `Suites:`, `Components:`,
    `Enabled: no` honoured; comment lines (`#`) ignored."""
    out: list[AptSource] = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        key = None
        for raw in stanza.splitlines():
            if raw.lstrip().startswith("#") or not raw.strip():
                continue
            if raw[:1] in (" ", "\t") and key:  # continuation line
                fields[key] += " " + raw.strip()
                continue
            if ":" in raw:
                key, value = raw.split(":", 1)
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split():
            continue
        if fields.get("enabled", "yes").lower() == "no":
            continue
        suites = tuple(fields.get("suites", "").split())
        comps = tuple(fields.get("components", "").split())
        for uri in fields.get("uris", "").split():
            out.append(AptSource(uri, suites, comps))
    return out


def read_sources(etc_apt: Path = Path("/etc/apt")) -> list[AptSource]:
    """Every enabled `deb` source of the machine, in apt's reading order."""
    out: list[AptSource] = []
    main = etc_apt / "sources.list"
    if main.is_file():
        out += parse_one_line(main.read_text(errors="replace"))
    d = etc_apt / "sources.list.d"
    if d.is_dir():
        for f in sorted(d.iterdir()):
            if f.suffix == ".list":
                out += parse_one_line(f.read_text(errors="replace"))
            elif f.suffix == ".sources":
                out += parse_deb822(f.read_text(errors="replace"))
    return out


def debian_mirror(sources: list[AptSource]) -> str:
    """The URI of the first source that carries the Debian archive (a suite without
    `-security`/`-updates`/`-backports` and the `main` component). Raises LookupError with
    what was found when there is none."""
    for s in sources:
        plain = [x for x in s.suites if not re.search(r"-(security|updates|backports)$|/", x)]
        if plain and "main" in s.components and "/debian" in s.uri.rstrip("/") + "/":
            return s.uri.rstrip("/")
    for s in sources:  # a mirror whose path does not say "debian", e.g. a local proxy
        plain = [x for x in s.suites if not re.search(r"-(security|updates|backports)$|/", x)]
        if plain and "main" in s.components and "security" not in s.uri:
            return s.uri.rstrip("/")
    found = ", ".join(f"{s.uri} {' '.join(s.suites)}" for s in sources) or "none"
    raise LookupError(f"no Debian archive among this machine's apt sources (found: {found})")
