"""Services: their state machine, the supervisor that performs it, their ops and
watchers (contract section 2).

Each file in one sentence: ``README.md`` here.
"""
