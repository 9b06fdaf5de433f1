"""oarbank-agent: the node agent.

The tree is the architecture; each folder's ``__init__`` has a sentence per file:

- ``agent.py``: the ``Agent``, which only wires the parts below together.
- ``jobs/``: jobs from ``submit`` to a finished run: the job machine, queue, admission,
  placement, the runner protocol (contract section 4).
- ``services/``: the service machine, the supervisor that performs it, ops, watchers, logs
  (contract section 2).
- ``broker/``: channels, connectors and the hand-over of connections (contract section 3).
- ``protection/``: host protection under memory and GPU pressure (contract section 5).
- ``sandbox/``: the walls around every child (contract section 9).
- ``modules/``: loading modules, matching them to the node, operators' changes (section 1).
- ``reporting/``: heartbeats and the metrics textfile (contract section 6).
- ``operate/``: the command line, config, control socket, state dir, drain, reload, demo.
- ``factory/``: the one process that starts every child.
- ``host/``: what the agent asks of the operating system.
- ``procs.py``, ``recovery.py``: process groups, and what a restarted agent does with its
  predecessor's.
- ``eventwait.py``, ``faults.py``: waiting on an event without losing a cancel; test-only fault
  injection.
"""
