"""Fleet dispatch, the node's side (contract section 10): claims, leases and results.

Each file in one sentence: ``README.md`` here.
"""
