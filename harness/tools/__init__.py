"""Tools for the project's other workflows: the README on a fresh machine, tests under Wine,
actionlint, the GPU check."""
