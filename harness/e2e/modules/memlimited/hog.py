"""A runner that allocates (and touches) `alloc_mb` MiB, then writes what its own cgroup's
memory.max and cpu.max say (as far as its sandbox lets it read them). Standard library only.

    hog.py run --spec W/spec.json --workdir W --out W/result.json
    hog.py doctor --json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def own_limits() -> dict[str, str]:
    out = {}
    try:
        rel = next(line[3:].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
    except (OSError, StopIteration) as exc:
        return {"error": f"/proc/self/cgroup: {exc}"}
    for name in ("memory.max", "cpu.max"):
        for mount in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
            try:
                out[name] = (Path(mount + rel) / name).read_text().strip()
                break
            except OSError as exc:
                out[name] = f"unreadable: {exc.strerror or exc}"
    return out


def main(argv: list[str]) -> int:
    if argv[:2] == ["doctor", "--json"]:
        print(json.dumps({"runner_protocol": {"supported": [1]}, "health": "healthy",
                          "capabilities": []}))
        return 0
    if argv[:1] != ["run"]:
        print(f"usage: hog.py run --spec S --workdir W --out O (got {argv})", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[argv.index("--spec") + 1]).read_text())
    out = argv[argv.index("--out") + 1]
    mb = int(spec["payload"].get("alloc_mb", 0))
    hog = bytearray(mb << 20)
    for i in range(0, len(hog), 4096):
        hog[i] = 1  # resident: charged to the attempt's cgroup
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"envelope": 1, "payload": {"allocated_mb": mb, "limits": own_limits()}}, f)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
