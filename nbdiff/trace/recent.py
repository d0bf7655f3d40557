"""Gradients autograd hands a recorder twice, worked on once.

A layer's input gradient and the output gradient of the layer before are one buffer seen
through two views (the identity node's backward is a view): half of all gradients. Both
frameworks reuse a handed buffer (paddle adds the next contribution into it, torch's
AccumulateGrad adopts it as ``param.grad``), so what is made of it (a copy, a summary) is made
when it is handed, and shared when the same buffer comes again unwritten.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

from nbdiff.frameworks import Framework

__all__ = ["RecentGradients"]

T = TypeVar("T")

_KEPT = 4
"""Gradients held for sharing: autograd hands the two views one after the other."""


class RecentGradients(Generic[T]):
    """The last few gradients hooks were handed, by the framework's alias key, each with what was
    made of it. They are held, so their memory is not reused under another gradient, and torch
    cannot add into them in place."""

    def __init__(self, fw: Framework) -> None:
        self.fw = fw
        self._made: dict[Hashable, tuple[Any, T]] = {}

    def made(self, grad: Any, make: Callable[[Any], T | None]) -> T | None:
        """``make(grad)``, or what it made of the same buffer handed before."""
        key = self.fw.gradient_alias_key(grad)
        hit = self._made.get(key) if key is not None else None
        if hit is not None:
            return hit[1]
        value = make(grad)
        if key is not None and value is not None:
            self._made[key] = (grad, value)
            if len(self._made) > _KEPT:
                del self._made[next(iter(self._made))]
        return value

    def clear(self) -> None:
        self._made.clear()
