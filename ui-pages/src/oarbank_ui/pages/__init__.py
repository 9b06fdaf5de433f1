"""Module pages and panels: the UI contract's renderer, its components, templates and static
files, the live portal's query runner and link targets, and ``preview``."""
