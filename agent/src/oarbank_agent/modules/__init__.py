"""Modules on this node (contract section 1): loading, matching against the node, what an
operator changed, removal.

Each file in one sentence: ``README.md`` here.
"""
