"""Progress for the slow parts: training steps compared, and a recorded loop compared afterwards.

``tqdm.auto`` (a widget in notebooks, text elsewhere) when it is installed; nothing otherwise.
A bar shows only after :data:`DELAY` seconds, so quick calls print nothing, and it clears
itself when done. ``NBDIFF_PROGRESS=0`` turns it off.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["DELAY", "progress", "counter"]

DELAY = 1.0
"""Seconds before a bar appears."""

T = TypeVar("T")


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """``items``, with a progress bar while they are consumed (if it takes longer than :data:`DELAY`)."""
    bar = _bar(desc, total) if total is None or total > 1 else None  # one step: nothing to count
    if bar is None:
        yield from items
        return
    try:
        for item in items:
            yield item
            bar.update(1)
    finally:
        bar.close()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def counter(desc: str) -> Any:
    """A bar without a total (steps of the user's own loop, as they run); ``update()`` and ``close()``."""
    bar = _bar(desc, None)
    return _Silent() if bar is None else bar


def _bar(desc: str, total: int | None) -> Any:
    if os.environ.get("NBDIFF_PROGRESS", "1") == "0":
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, delay=DELAY, leave=False, unit="step")
