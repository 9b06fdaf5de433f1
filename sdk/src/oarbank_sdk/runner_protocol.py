"""Runner protocol 1's constants, by upstream's names (``oarbank_sdk.runner_protocol``):
exit codes, environment variable names, workdir file names and the agent's end reasons.
Standard library only.

Upstream's module also holds pydantic models of the documents (``DoctorOutput``, ``Control``,
``Failure``, ``Event``, ...); this SDK has none of them: the conformance kit checks a
doctor's answer with ``oarbank_sdk.doctorform`` and the agent reads the others itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["CHECKPOINT_DATA_MAX", "CHECKPOINT_DIR", "CONTROL_FILE", "ENV_ATTEMPT", "ENV_BROKER",
           "ENV_CONTROL_EVENT", "ENV_FOLDERS_FILE", "ENV_LIMITS_FILE", "ENV_MODULE",
           "ENV_MODULE_DATA", "ENV_PLATFORM", "ENV_PROTOCOL", "ENV_SETTINGS_FILE", "ENV_TMP",
           "ENV_TOOLS_FILE", "ENV_WORKDIR", "EXIT_INVALID_SPEC", "EXIT_MISSING_DEP", "EXIT_OK",
           "EXIT_RETRYABLE", "FAILURE_FILE", "FAILURE_REASONS", "PHASE_FILE", "RESULT_FILE",
           "disproved_capabilities"]

EXIT_OK = 0  # result.json written
EXIT_INVALID_SPEC = 2  # the spec can never succeed: the job's fault
EXIT_MISSING_DEP = 3  # the node lacks something: the host's fault
EXIT_RETRYABLE = 75  # transient (EX_TEMPFAIL); 2, 3 and 75 count only with a failure.json

ENV_WORKDIR = "OARBANK_WORKDIR"
ENV_TMP = "OARBANK_TMP"
ENV_PLATFORM = "OARBANK_PLATFORM"
ENV_MODULE = "OARBANK_MODULE"
ENV_MODULE_DATA = "OARBANK_MODULE_DATA"
ENV_ATTEMPT = "OARBANK_ATTEMPT_ID"
ENV_PROTOCOL = "OARBANK_PROTOCOL"
ENV_SETTINGS_FILE = "OARBANK_SETTINGS_FILE"
ENV_LIMITS_FILE = "OARBANK_LIMITS_FILE"
ENV_BROKER = "OARBANK_BROKER"
ENV_TOOLS_FILE = "OARBANK_TOOLS_FILE"
ENV_FOLDERS_FILE = "OARBANK_FOLDERS_FILE"
ENV_CONTROL_EVENT = "OARBANK_CONTROL_EVENT"

CONTROL_FILE = "control.json"
FAILURE_FILE = "failure.json"
RESULT_FILE = "result.json"
PHASE_FILE = "phase"
CHECKPOINT_DIR = "checkpoint"
CHECKPOINT_DATA_MAX = 4096

FAILURE_REASONS = ("bad_input", "mode_mismatch", "oom", "doctor", "no_metrics")


def disproved_capabilities(checks: Iterable[Any] | None) -> set[str]:
    """The names of a doctor's failed checks (a check named after a capability disproves it
    for the module). ``checks``: JSON objects or objects with ``name`` and ``ok``."""
    out = set()
    for c in checks or ():
        if isinstance(c, dict):
            name, ok = c.get("name"), c.get("ok")
        else:
            name, ok = getattr(c, "name", None), getattr(c, "ok", None)
        if isinstance(name, str) and name and not ok:
            out.add(name)
    return out
