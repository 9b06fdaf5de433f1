"""The example's model service, plus a helper process in the service's process group.

`start` first leaves a helper (`oarbank-e2e-helper`, a sleeper) in the op's process group,
as a real server's worker or log shipper would be, then runs the example's own
`model_service.py` unchanged. Unlike the daemon, the helper does not exit when the agent's
channel closes: only ending the service's whole process group ends it. That is what the
scenarios need to see: after a `kill -9` of the agent the helper survives, and the next agent
must end the old group; after any stop, nothing of the group may remain.
"""

from __future__ import annotations

import os
import runpy
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

if sys.argv[-1] == "start":
    subprocess.Popen([sys.executable, "-I", "-c", "import time; time.sleep(3600)",
                      "oarbank-e2e-helper"], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=HERE)
target = os.path.join(HERE, "model_service.py")
sys.argv = [target, *sys.argv[1:]]
runpy.run_path(target, run_name="__main__")
