"""Jobs: from ``submit`` to a finished run (contract section 4).

Files (one sentence each):

- ``admission.py``: FIFO token admission (pure): which waiting jobs may take their pool tokens
  now.
- ``machine.py``: The job state machine, pure: no processes, no clock reads, no I/O.
- ``placement.py``: Where a job stands against this node's services: which services it
  reserves, the admission request it becomes, whether it can ever run here,
  and who uses a service.
- ``queue.py``: The node's jobs from submit to their runs: records, the queue, admission,
  service users.
- ``run.py``: The run of an admitted job: wait for its services, run attempts, retry,
  finish or release.
- ``runner.py``: One attempt of a job: the runner protocol (contract section 4), effects
  only.
- ``runnerevents.py``: Runner events (G12): ``--events <W>/events.ndjson`` for runners that emit
  events (contract section 4), kept with the attempt.
- ``runnerhealth.py``: Runner health (G12): ``<runner.exec...> doctor --json`` (contract section
  4) when a module is loaded and at every refresh (``runningwatch``,
  ``--refresh-s``).
- ``store.py``: Job records: one JSON file per job, written atomically, so no submitted job
  is ever lost.
- ``waiting.py``: Why a queued job is not admitted, in words a person can act on (pure, from
  service state).
"""
