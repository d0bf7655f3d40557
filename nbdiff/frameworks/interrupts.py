"""Undoing what nbdiff did to the user's objects, whole, even when Ctrl-C comes meanwhile.

A Ctrl-C while hooks are removed or patched functions restored would leave half of them in
place, never undone later (hundreds of paddle functions wrapped, a hook on every layer). The
undo runs with SIGINT held; a Ctrl-C that came meanwhile is raised once it is done. So does
putting them on: a Ctrl-C between registering a hook and keeping its handle left the hook, and
nothing that could remove it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

try:  # signal's C module: signal.py's wrappers convert every handler to and from an enum (12.9 µs a block, 3 here)
    import _signal as _handlers
except ImportError:  # not CPython
    _handlers = signal  # type: ignore[assignment]

__all__ = [
    "interrupts_deferred",
    "done_whole",
    "undone_whole",
    "is_interrupt",
    "lost_interrupts_kept",
    "raise_lost_interrupt",
]


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C: a ``KeyboardInterrupt``, or the ``OSError`` paddle raises in its
    place when the Ctrl-C came in Python code it called (a PyLayer's backward, a hook), whose text
    names it. Reported as anything else, an interrupt read as the model's error."""
    return isinstance(exc, KeyboardInterrupt) or (isinstance(exc, OSError) and "KeyboardInterrupt" in str(exc))


class _Caught:
    """The SIGINT handler while a block runs deferred: it notes the Ctrl-C."""

    def __init__(self) -> None:
        self.signals: list[int] = []

    def __call__(self, signum: int, frame: Any) -> None:
        self.signals.append(signum)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Run the block to its end; a Ctrl-C during it is raised after (main thread only: elsewhere,
    and where Python does not own SIGINT's handler, the block runs as it is). Inside another such
    block, the outer one holds the Ctrl-C until it ends."""
    previous: Any = None
    if threading.current_thread() is threading.main_thread():
        previous = _handlers.getsignal(signal.SIGINT)
    if previous is None or previous in (signal.SIG_IGN, signal.SIG_DFL) or isinstance(previous, _Caught):
        yield
        return
    caught = _Caught()
    _handlers.signal(signal.SIGINT, caught)
    try:
        yield
    finally:
        _handlers.signal(signal.SIGINT, previous)
        if caught.signals:
            raise KeyboardInterrupt


def done_whole(do: Callable[[], Any], undo: Callable[[], Any]) -> None:
    """Run ``do`` (hooks, patches, the collector's settings put on) under :func:`interrupts_deferred`, whole
    or not at all: if anything raises, a Ctrl-C meanwhile or as the deferral begins included, ``undo``
    takes off what was put on (see :func:`undone_whole`) and the error is raised."""
    try:
        with interrupts_deferred():
            do()
    except BaseException:
        undone_whole(undo)
        raise


def undone_whole(undo: Callable[[], Any]) -> None:
    """Run ``undo`` (hooks off, patches and the collector back) to its end under :func:`interrupts_deferred`.
    A Ctrl-C can land as the deferral begins, before it holds SIGINT: ``undo`` then never ran, and a hook
    stayed on the user's model for good. It runs all the same, and the Ctrl-C is raised after."""
    began = False
    try:
        with interrupts_deferred():
            began = True
            undo()
    except BaseException:
        if not began:
            undo()
        raise


_lost = False
_kept = 0  # recorders keeping lost interrupts: the hook stays while any does
_previous_hook: Any = None


def _unraisable(u: Any) -> None:
    global _lost
    if u.exc_type is not None and issubclass(u.exc_type, KeyboardInterrupt):
        _lost = True  # raised again at the next recorded call
    _previous_hook(u)


def lost_interrupts_kept(on: bool) -> None:
    """While on (counted: each recorder turns it on and off once), a Ctrl-C that Python drops is kept.

    A Ctrl-C that lands in a weak reference's callback or a ``__del__`` (torch's, paddle's, a user's)
    is printed as "Exception ignored" and lost, and the user's loop runs on; ``sys.unraisablehook``
    still sees it. :func:`raise_lost_interrupt` raises it at the next layer call.
    """
    global _kept, _previous_hook, _lost
    if on:
        _kept += 1
        if _kept == 1:
            _previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable
    elif _kept > 0:
        _kept -= 1
        if _kept == 0:
            if sys.unraisablehook is _unraisable:  # else someone hooked after us: leave theirs
                sys.unraisablehook = _previous_hook
            _lost = False


def raise_lost_interrupt() -> None:
    """Raise the Ctrl-C that Python dropped since the last call, if it did."""
    global _lost
    if _lost:
        _lost = False
        raise KeyboardInterrupt
