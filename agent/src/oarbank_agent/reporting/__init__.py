"""What the node reports: heartbeats to the portal, the metrics textfile (contract section 6).

Each file in one sentence: ``README.md`` here.
"""
