"""Host protection: memory and GPU pressure, the operator's rules (contract section 5).

Files (one sentence each):

- ``decisions.py``: Host protection decisions (contract section 5): pure functions, no processes,
  no clock.
- ``guard.py``: Host protection, the sampling half (contract section 5): samples the OS,
  reports actions.
- ``hostrules.py``: The host rules of ``oarbank-agent protect`` (``--forbid-gpu``, ``--evict``),
  kept in ``<state>/host_rules.json`` so that an agent restart keeps them: an
  operator who evicted the node's services for maintenance does not want them
  back because the agent restarted.
"""
