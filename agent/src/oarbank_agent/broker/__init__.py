"""The connection broker: jobs reach endpoint services, nothing listens (contract section 3).

Each file in one sentence: ``README.md`` here.
"""
