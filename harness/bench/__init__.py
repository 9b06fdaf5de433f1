"""Benchmarks: the warm path against what users would do instead, side by side in one run.

``python -m harness.bench [--quick] [--out FILE] [--only FIG,...]`` (``nox -s bench``):
runs each figure (see ``figures``) against a real ``oarbank-agent run``, prints a table and
writes results.json (default ``.bench/results.json``).
"""
