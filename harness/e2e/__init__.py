"""End-to-end scenarios on real nodes: ``python -m harness`` (``nox -s e2e``)."""
