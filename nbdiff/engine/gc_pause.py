"""Python's cyclic garbage collector paused while one check runs.

A check allocates many small objects (calls, events, tensor records) and keeps them alive
until it ends, so the collector's full passes found nothing to free and cost a fifth of
``auto_diff`` on a 2,000-layer model (``benchmarks/bench_scaling.py --deep``). Reference
counting still frees everything else; the collector runs again, as it was, when the check
ends, however it ends. Only bounded work is wrapped (a few steps), never a user's loop.
``@gc_paused()`` wraps a whole function.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]


@contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
