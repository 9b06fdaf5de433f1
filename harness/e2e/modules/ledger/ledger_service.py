"""The example's model service, keeping a ledger: every prompt `start <job id>`, `done <job id>`
or `recorded <job id>` it answers is first appended, one line, to `model.ledger` in its data
dir. The chaos run counts a job's work done twice from there (two `done` lines), not from
anything the agent says, and tells a finished attempt run again (two `recorded`) from a runner
killed between its `done` and its result.

It runs the example's own `model_service.py` (as a module, so that its `complete` can be
wrapped); its `start` op starts this file again as the daemon.
"""

from __future__ import annotations

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
LEDGER = "model.ledger"

spec = importlib.util.spec_from_file_location("model_service", os.path.join(HERE, "model_service.py"))
assert spec is not None and spec.loader is not None
service = importlib.util.module_from_spec(spec)
spec.loader.exec_module(service)
service.__file__ = os.path.abspath(__file__)  # `start` runs this file as the daemon
_complete = service.complete


def complete(prompt: str) -> str:
    if prompt.split(" ", 1)[0] in ("start", "done", "recorded"):
        fd = os.open(service.data_dir() / LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, f"{prompt}\n".encode())  # one write: whole lines, in answer order
        finally:
            os.close(fd)
    return _complete(prompt)


service.complete = complete

if __name__ == "__main__":
    sys.exit(service.main(sys.argv[1:]))
