"""Walls around every child (contract section 9): the sandbox policy, cgroups, resource
limits, the escape check, refused network attempts.

Files (one sentence each):

- ``containment.py``: Containment: every attempt, op and service daemon group in a cgroup of
  its own (Linux, v2).
- ``escapewatch.py``: The escape check: every few seconds, each process of a sandboxed group is
  still confined.
- ``policy.py``: The agent's sandbox policy: whether its children are confined, and what
  it reports.
- ``refusals.py``: Every network attempt of a confined child, counted per service and per
  attempt.
- ``resourcelimits.py``: Resources as limits (G4): a stage's ``requires.resources.mem_gb`` and
  ``cpu`` become its attempt cgroup's ``memory.max`` and ``cpu.max``
  (cgroup v2), and an attempt the OOM killer ended fails as a job fault
  ``oom`` that names the limit.
"""
