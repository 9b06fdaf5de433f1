"""The connection broker: jobs reach endpoint services, nothing listens (contract section 3).

Files (one sentence each):

- ``channel.py``: An endpoint channel: the agent's end of one run of one endpoint service
  (contract section 3).
- ``connector.py``: A connector: the agent's end of one (attempt, service) pair, where a job asks
  for connections.
- ``handover.py``: The connection broker: jobs reach endpoint services, nothing listens (contract
  section 3).
- ``msgstream.py``: One end of a line-based stream on the agent's event loop (a connector or a
  channel).
- ``ratelimit.py``: A token bucket: the connect rate limit of one connector (contract section 3).
"""
