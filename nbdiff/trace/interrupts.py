"""Undoing what nbdiff did to the user's objects, whole, even when Ctrl-C comes meanwhile.

A Ctrl-C while hooks are removed or patched functions restored would leave half of them in
place, never undone later (hundreds of paddle functions wrapped, a hook on every layer). The
undo runs with SIGINT held; a Ctrl-C that came meanwhile is raised once it is done.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["interrupts_deferred", "is_interrupt"]


def is_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a Ctrl-C: a ``KeyboardInterrupt``, or the ``OSError`` paddle raises in its
    place when the Ctrl-C came in Python code it called (a PyLayer's backward, a hook), whose text
    names it. Reported as anything else, an interrupt read as the model's error."""
    return isinstance(exc, KeyboardInterrupt) or (isinstance(exc, OSError) and "KeyboardInterrupt" in str(exc))


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Run the block to its end; a Ctrl-C during it is raised after (main thread only: elsewhere,
    and where Python does not own SIGINT's handler, the block runs as it is)."""
    previous: Any = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGINT)
    if previous is None or previous in (signal.SIG_IGN, signal.SIG_DFL):
        yield
        return
    caught: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt
