"""What a script run in place must not take from the factory: the modules the factory holds
that a fresh ``python -I`` start would not have loaded.

A module's process imports what a fresh interpreter would, never the factory's copy (contract
section 4: "nothing the agent has imported itself may shadow it"). Two rules, chosen over the
alternatives (exec whenever anything could shadow; re-import everything; a finder that hands
back held modules whose file matches, which cannot see what a held module imported under it):

- A module the factory holds that a fresh start lacks, outside the standard library (our SDK,
  the agent's package, pyseccomp, ...), is dropped from ``sys.modules`` before the script runs
  (``forget``): the script imports it afresh from wherever its own ``sys.path`` finds it (a
  bundled copy, a nested package, a newer version installed since the factory started). Exact
  wherever the copy lives. The cost: the few such modules a script imports are executed again
  (their standard-library imports stay loaded: that is the speed).
- The standard library stays loaded: it is the interpreter's own and cannot change under it.
  It could still be shadowed by a file of the same name that the script puts first on its
  path; a module keeps such files next to its scripts, so a script whose folder holds one for
  a module the factory holds (and a fresh start lacks) is exec'd (``shadowed``). Only the
  script's folder is looked at: a standard-library name bundled elsewhere is not seen.

Which modules those are is taken in the factory (``snapshot``, again only when its
``sys.modules`` has grown: it never drops one), not in each child: reading every name of
``sys.modules`` there touched (copied) about a hundred pages a child.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import os
import sys
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["Held", "snapshot", "shadowed", "forget"]


@dataclass(frozen=True)
class Held:
    """The factory's modules as a child must see them, taken when it held ``count``."""

    count: int
    stdlib_tops: frozenset[str]  # top-level standard-library names held, not by a fresh start
    foreign: tuple[str, ...]  # modules outside the standard library a fresh start lacks


def snapshot(fresh: Collection[str], previous: Held | None = None) -> Held:
    """``sys.modules`` now, against a fresh start's ``fresh``; ``previous`` when nothing was
    imported since it was taken."""
    if previous is not None and previous.count == len(sys.modules):
        return previous
    names = list(sys.modules)
    std = sys.stdlib_module_names
    tops = {n.partition(".")[0] for n in names} - set(fresh)
    return Held(len(names), frozenset(t for t in tops if t in std),
                tuple(n for n in names if n not in fresh and n.partition(".")[0] not in std))


def shadowed(folder: str, held: Held) -> str | None:
    """The standard-library module held here (not by a fresh start) that a module file in
    ``folder`` would replace once the script puts ``folder`` first on ``sys.path``; None if
    none (or ``folder`` cannot be listed: then no import finds anything in it either)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return None
    # Top-level names only: a package a fresh start has already (os, encodings) is found in
    # sys.modules by both, whatever the folder holds, and so are its submodules.
    for name in sorted({e.partition(".")[0] for e in entries} & held.stdlib_tops):
        spec = importlib.machinery.PathFinder.find_spec(name, [folder])
        if spec is not None and spec.loader is not None:  # not a namespace portion
            return name
    return None


_set_aside: list[Any] = []


def forget(held: Held, meta_path: list[Any], path_hooks: list[Any]) -> None:
    """``sys.modules`` and the import machinery as a fresh start has them, but for the
    standard library: every other module the factory imported for itself goes, and its name
    with it from a package that stays. ``meta_path``, ``path_hooks``: the factory's own at its
    start (a fresh start's)."""
    for name in held.foreign:
        mod = sys.modules.pop(name, None)
        if mod is None:
            continue
        _set_aside.append(mod)  # kept alive: freeing it would only touch (copy) pages
        parent, _, leaf = name.rpartition(".")
        owner = sys.modules.get(parent) if parent else None
        if owner is not None and getattr(owner, leaf, None) is mod:
            with contextlib.suppress(AttributeError, TypeError):
                delattr(owner, leaf)
    sys.meta_path[:] = meta_path
    sys.path_hooks[:] = path_hooks
    importlib.invalidate_caches()  # folders' listings as they are now, not at the factory's start
