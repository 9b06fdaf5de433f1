"""Walls around every child (contract section 9): the sandbox policy, containment, resource
limits, the escape check, refused network attempts.

Each file in one sentence: ``README.md`` here.
"""
