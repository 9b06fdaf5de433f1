"""The debootstrap mirror comes from the machine's apt configuration, both file formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.nodes.aptsources import (
    AptSource,
    debian_mirror,
    parse_deb822,
    parse_one_line,
    read_sources,
)

ONE_LINE = """
# comment
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.test/debian bookworm main contrib
deb-src http://mirror.test/debian bookworm main
deb http://mirror.test/debian-security bookworm-security main
"""

DEB822 = """Types: deb
# a comment inside the stanza
URIs: http://security.test/debian-security
Suites: bookworm-security
Components: main

Types: deb deb-src
URIs: http://archive.test/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
Enabled: no
URIs: http://disabled.test/debian
Suites: bookworm
Components: main
"""


def test_one_line_format_skips_src_and_options() -> None:
    got = parse_one_line(ONE_LINE)
    assert got[0] == AptSource("http://mirror.test/debian", ("bookworm",), ("main", "contrib"))
    assert len(got) == 2


def test_deb822_stanzas_honour_enabled_no() -> None:
    got = parse_deb822(DEB822)
    assert [s.uri for s in got] == ["http://security.test/debian-security",
                                    "http://archive.test/debian"]
    assert got[1].suites == ("bookworm", "bookworm-updates")


def test_the_mirror_is_the_first_main_archive_not_security() -> None:
    assert debian_mirror(parse_deb822(DEB822)) == "http://archive.test/debian"
    assert debian_mirror(parse_one_line(ONE_LINE)) == "http://mirror.test/debian"


def test_read_sources_reads_list_and_sources_files_only(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "a.sources").write_text(DEB822)
    (tmp_path / "sources.list.d" / "b.list.disabled").write_text(
        "deb http://ignored.test/debian bookworm main\n")
    got = read_sources(tmp_path)
    assert "http://ignored.test/debian" not in [s.uri for s in got]
    assert debian_mirror(got) == "http://archive.test/debian"


def test_no_debian_archive_is_a_clear_error() -> None:
    with pytest.raises(LookupError, match="no Debian archive.*http://x.test/y stable-security"):
        debian_mirror([AptSource("http://x.test/y", ("stable-security",), ("main",))])
