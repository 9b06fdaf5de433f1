"""Real wheels for the module-environment tests, fetched at test time from this machine's own
package index (pip's configuration: no host is named here) and kept in ``.cache/test-wheels``
(git-ignored) for every later run and every test that needs them."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "test-wheels"
CPTAG = f"cp{sys.version_info.major}{sys.version_info.minor}"


def wheel(name: str, version: str | None = None) -> Path:
    """A wheel of ``name`` (``==version`` when given; else any this interpreter can use),
    downloaded once into the cache."""
    CACHE.mkdir(parents=True, exist_ok=True)

    def cached() -> list[Path]:
        pattern = f"{name}-{version}-*.whl" if version else f"{name}-*.whl"
        found = sorted(CACHE.glob(pattern))
        return [p for p in found if "-none-any" in p.name or f"-{CPTAG}-" in p.name]

    if not cached():
        spec = f"{name}=={version}" if version else name
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--only-binary", ":all:",
                               "--no-deps", "--disable-pip-version-check", "-d", str(CACHE),
                               spec], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and cached(), (
            f"cannot fetch a wheel of {spec} from this machine's package index "
            f"(pip config list):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return cached()[-1]


def version_of(whl: Path) -> str:
    return whl.name.split("-")[1]


def pin_line(whl: Path) -> str:
    sha = hashlib.sha256(whl.read_bytes()).hexdigest()
    return f"{whl.name.split('-')[0]}=={version_of(whl)} --hash=sha256:{sha}"


def bundle_wheels(module: Path, wheels: list[Path], requirements_dir: Path | None = None,
                  ) -> Path:
    """Copy ``wheels`` into ``<module>/wheels`` and write their pins into the
    ``requirements.txt`` of ``requirements_dir`` (the module's folder by default)."""
    (module / "wheels").mkdir(parents=True, exist_ok=True)
    for w in wheels:
        shutil.copy(w, module / "wheels" / w.name)
    req = (requirements_dir or module) / "requirements.txt"
    req.write_text("# pinned by the test\n" + "".join(pin_line(w) + "\n" for w in wheels))
    return req
