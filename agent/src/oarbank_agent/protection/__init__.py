"""Host protection: memory and GPU pressure, the operator's rules (contract section 5).

Each file in one sentence: ``README.md`` here.
"""
