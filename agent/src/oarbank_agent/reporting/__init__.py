"""What the node reports: heartbeats to the portal, the metrics textfile (contract section 6).

Files (one sentence each):

- ``heartbeat.py``: Heartbeats: the node's report posted to the portal (contract section 6).
- ``textfile.py``: ``--metrics-textfile PATH``: this node's figures for node_exporter's textfile
  collector.
"""
