"""``oarbank-agent demo --compare``: the same N jobs run cold, measured.

Without a warm service every job loads the model itself. This runs exactly that: one process
per job (``python -I``), importing the example's own ``model_service`` and calling its
``load_model`` and ``complete`` on the job's prompts, as many at a time as the warm service
has slots. Loads are counted the way the warm run counts them (the example's ``model.loads``
file, here in a temporary data dir), so the comparison is two measurements, not a formula.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ColdRun", "run_cold"]

# One cold job: load the model, answer the prompts, check each answer arrived.
_JOB = """
import sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
import model_service as m
m.load_model(Path(sys.argv[2]), float(sys.argv[3]))
texts = [m.complete(p) for p in sys.argv[4:]]
assert len(texts) == len(sys.argv) - 4 and all(texts)
"""


@dataclass(frozen=True)
class ColdRun:
    jobs: int
    succeeded: int
    model_loads: int
    parallel: int
    wall_s: float
    errors: tuple[str, ...]


def run_cold(example: Path, data_dir: Path, prompts: list[list[str]], load_s: float,
             parallel: int) -> ColdRun:
    """Run one cold job per entry of ``prompts`` (``parallel`` at a time); measure the wall."""
    data_dir.mkdir(parents=True, exist_ok=True)

    def job(job_prompts: list[str]) -> str | None:
        r = subprocess.run([sys.executable, "-I", "-c", _JOB, str(example), str(data_dir),
                            str(load_s), *job_prompts], stdin=subprocess.DEVNULL,
                           capture_output=True, text=True)
        if r.returncode == 0:
            return None
        return f"exit {r.returncode}: {(r.stderr.strip().splitlines() or ['?'])[-1]}"

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as ex:
        outcomes = list(ex.map(job, prompts))
    wall = time.monotonic() - t0
    loads_file = data_dir / "model.loads"
    loads = len(loads_file.read_text().split()) if loads_file.exists() else 0
    errors = tuple(e for e in outcomes if e is not None)
    return ColdRun(jobs=len(prompts), succeeded=len(prompts) - len(errors), model_loads=loads,
                   parallel=parallel, wall_s=wall, errors=errors)
