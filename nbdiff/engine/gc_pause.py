"""Python's cyclic garbage collector paused while one check runs.

A check allocates many small objects (calls, events, tensor records) and keeps them alive
until it ends, so the collector's full passes found nothing to free and cost a fifth of
``auto_diff`` on a 2,000-layer model (``benchmarks/bench_scaling.py --deep``). Reference
counting still frees everything else; the collector runs again, as it was, when the check
ends, however it ends. Only bounded work is wrapped (a few steps), never a user's loop.
``with gc_paused():`` wraps it.

Around a user's own loop (``watch``, ``record``) the collector keeps running, but what existed
before the loop began (the models, the frameworks' modules and objects, the notebook's state) is
moved out of its sight (:func:`gc_frozen`): every full pass over it found nothing to free, while the
loop's recordings made many passes (a 20-step watch of 100 layers: 0.93 s of 3.40 spent in the
collector, 0.12 frozen). And the young generation is collected less often (:data:`YOUNG_THRESHOLD`):
a recorded step allocates tens of thousands of small objects that all live until the step is
compared, so each young pass over them freed nothing (22 passes a step, 9 of a 125 ms watched step).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from nbdiff.frameworks.interrupts import done_whole, interrupts_deferred, undone_whole

__all__ = ["gc_paused", "GcPause", "gc_frozen", "YOUNG_THRESHOLD"]

DEFAULT_THRESHOLD = 700
"""CPython's own first threshold (``gc.get_threshold()[0]``); a user's other value is left as it is."""
YOUNG_THRESHOLD = 20_000
"""Allocations between passes over the young generation while a user's loop is recorded: cyclic garbage
the loop makes (a few thousand objects at most) waits that much longer to be freed."""


class GcPause:
    """The collector off from ``with`` until :meth:`restore` (which ``with`` calls as it ends; what holds
    the pause calls it too: a Ctrl-C handled as ``__exit__`` begins skips that call)."""

    def __init__(self) -> None:
        self._turned_off = False  # this pause turned the collector off: it turns it on, once

    def __enter__(self) -> GcPause:
        done_whole(self._pause, self._restored)  # set and put back whole: a Ctrl-C meanwhile is raised after
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()

    def restore(self) -> None:
        """The collector as it was before (again: nothing, not even a moment a Ctrl-C could land in)."""
        if self._turned_off:
            undone_whole(self._restored)

    def _pause(self) -> None:
        if gc.isenabled():
            gc.disable()
            self._turned_off = True

    def _restored(self) -> None:
        if self._turned_off:
            self._turned_off = False
            gc.enable()


def gc_paused() -> GcPause:
    """The collector paused while a bounded piece of work runs (``with gc_paused():``)."""
    return GcPause()


@contextmanager
def gc_frozen() -> Iterator[None]:
    """Every object alive now left out of the collector's passes until the block ends (``gc.freeze``),
    then handed back to it, and the young generation collected every :data:`YOUNG_THRESHOLD` allocations
    instead of CPython's 700. A garbage cycle among the frozen is freed only then. Where anything is frozen
    already (the user's own ``gc.freeze()``, an outer nbdiff block), nothing is frozen: unfreezing is all or
    nothing, and theirs stays theirs; a threshold the user set is theirs too."""
    undo: list[Callable[[], None]] = []
    try:
        with interrupts_deferred():  # set whole, and undone whole, whatever Ctrl-C meanwhile
            thresholds = gc.get_threshold()
            if thresholds[0] == DEFAULT_THRESHOLD:
                gc.set_threshold(YOUNG_THRESHOLD, *thresholds[1:])
                undo.append(lambda: gc.set_threshold(*thresholds))
            if not gc.get_freeze_count():
                gc.freeze()
                undo.append(gc.unfreeze)
        yield
    finally:

        def undone() -> None:
            for step in reversed(undo):
                step()

        undone_whole(undone)
