"""The sandbox's seccomp filter, built once in the factory instead of once per child.

The launcher's filter (``oarbank_sdk.sandbox._linux._build_filter``) depends only on the
guarded pids (the agent) and whether network attempts are notified: two variants per agent.
Building one is ~1.7 ms of libseccomp calls; the factory builds both before it forks anything,
and its children load the copy they inherit (``load`` still compiles it to BPF in the child).
Any other combination is built as before.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["prebuild"]


def prebuild(linux: Any, guard_pids: tuple[int, ...]) -> None:
    """Wrap ``linux._build_filter`` with a cache filled now for ``guard_pids``."""
    build = linux._build_filter
    if getattr(build, "_factory_cache", None) is not None:
        return
    try:
        pyseccomp = linux._import_pyseccomp()
        from oarbank_sdk.sandbox._notify import NOTIFIED_SYSCALLS
    except (ImportError, OSError):
        return  # no binding here: the children's launch fails as the launcher's would
    cache: dict[tuple[tuple[str, ...], tuple[int, ...]], Any] = {}
    for notified in ((), tuple(NOTIFIED_SYSCALLS)):
        with contextlib.suppress(Exception):  # an error is the child's to report, as before
            cache[(notified, guard_pids)] = build(pyseccomp, notified, guard_pids)

    def cached(ps: Any, notified: tuple[str, ...] = (), guard: tuple[int, ...] = ()) -> Any:
        filt = cache.get((tuple(notified), tuple(guard)))
        return filt if filt is not None and ps is pyseccomp else build(ps, notified, guard)

    cached._factory_cache = cache  # type: ignore[attr-defined]
    linux._build_filter = cached
