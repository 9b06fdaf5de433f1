"""The conformance kit: ``oarbank-sdk conform MODULE_DIR [--json]`` (contract section 8).

Public API: ``run(module_dir, json_output=False, keep=False) -> int`` (0 all passed, 1 any
failure). The steps it takes are listed in ``kit``'s banner; the other modules are its parts:

- ``kit``: the run, step by step (manifest, sandbox, services, goldens, specs, stop).
- ``service``: one endpoint service run as the agent runs it (start, checks, stop).
- ``goldens``: the goldens through the module's runner.
- ``specs``: the service specs over handed connections.
- ``runnerspecs``: the runner specs, and a line for each other kind of ``conformance.json`` entry.
- ``host``: what the kit does as an agent would (op environment, ops, groups, runner).
- ``agentends``: the agent's ends of a channel and of a connector (re-exported by ``host``).
- ``doctor``: the runner's ``doctor --json`` answer, held to the contract's form.
- ``start``: a service's fingerprint, its hello and the logs shown when a check fails.
- ``attempts``: the sandbox's watch of network attempts (``socket``, ``bind``, ...).
- ``listeners``: the listening sockets held by a set of processes.
- ``inputs``: upstream goldens and ``conformance.json`` settings.
- ``expect``: a spec's ``expect.body`` as a subset of the answer.
- ``logs``: the end of a service's logs.
- ``report``: the checks' lines, the summary and the JSON report.
"""

from __future__ import annotations

from oarbank_sdk.conform.kit import run, sandbox_wrapper

__all__ = ["run", "sandbox_wrapper"]
