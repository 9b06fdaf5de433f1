"""Jobs: from ``submit`` to a finished run (contract section 4).

Each file in one sentence: ``README.md`` here.
"""
