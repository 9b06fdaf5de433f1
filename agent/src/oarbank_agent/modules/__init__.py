"""Modules on this node (contract section 1): loading, matching against the node, what an
operator changed, removal.

Files (one sentence each):

- ``compat.py``: Can a module run on this node? The pure match of a manifest against the node
  (contract section 1.2), made once at load (a module refused) and at submit (a
  stage refused).
- ``loaded.py``: Loaded modules and the node's identity: what every op and runner environment is
  built from.
- ``remove.py``: ``oarbank-agent module remove ID [--now]``: a module taken off a running agent
  for good (G9, with G6's ``destroy`` of what it owns).
- ``state.py``: What an operator changed about this node's modules at run time, kept in
  ``<state>/modules.json`` so that an agent restart keeps it: the modules disabled
  (``oarbank-agent module disable``), the module folders added (``module add``) and
  the modules removed (``module remove``: not loaded again even when the command
  line names their folder, until ``module add`` loads one again).
"""
