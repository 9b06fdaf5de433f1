"""Services: their state machine, the supervisor that performs it, their ops and
watchers (contract section 2).

Files (one sentence each):

- ``detachedwatch.py``: Watching a running service that left nothing the agent can see: sparse
  ``status`` polls.
- ``fingerprint.py``: Reading a service's ``fingerprint`` answer (contract section 2), pure.
- ``lifecycle.py``: The service state machine (contract section 2), pure: no processes, no
  clock reads, no I/O.
- ``manualwatch.py``: Manual services: fingerprinted again now and then, since nothing else
  tells us they changed.
- ``ops.py``: Running one service op: ``<exec...> <op>`` (contract section 2).
- ``overrides.py``: Per-service timing overrides from the config file
  (``[services."<module>/<service>"]``).
- ``ownedwatch.py``: Owned objects are reaped (G6): each service's ``list_owned`` every 60 s
  and whenever an attempt ends, then ``destroy <id> --force`` for each
  object whose attempt is over.
- ``runningwatch.py``: Running services stay known: their ``fingerprint`` again every
  ``--refresh-s`` (default 20, as upstream) and once right after each
  becomes ready.
- ``servicelog.py``: A service's log, ``modules/<id>/logs/<service>.log``, collected by the
  agent and rotated by size.
- ``supervisor.py``: The supervisor: performs what ``lifecycle.decide`` says, and reports back
  with ``apply``.
"""
