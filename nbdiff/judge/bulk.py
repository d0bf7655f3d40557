"""A step's tensor comparisons made together: gathered first, then decided in a few numpy passes over
all of them, where each alone would be a dozen small numpy calls and Python around each.

What comes out is what :func:`~nbdiff.judge.metrics.compare_tensors` (``lazy=True``) gives for each
pair, field for field: the passes decide the two outcomes that need no more than ``max |a - b|`` and
``max |b|`` (bit-identical; every difference within ``atol``), the maxima are exact whatever order they
are taken in, and any other pair (a difference beyond ``atol``, NaN/Inf, shapes or dtypes apart, a
scalar, a large tensor, another mode) is compared alone, as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from nbdiff.judge.metrics import (
    FRESH_MAX,
    TensorDiff,
    absolute_tolerance,
    compare_tensors,
    identical,
    passed_lazily,
)
from nbdiff.judge.tolerance import Tolerance

__all__ = ["Comparisons", "chunks", "largest_magnitudes", "starts"]

_AT_ONCE = 8
"""Fewer pairs than this are compared one by one: the passes' own cost is not made back."""
_CHUNK = 1 << 16
"""Elements per side decided in one pass: what the passes hold beside the records stays a few MiB."""
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class _Pair(NamedTuple):
    name: str
    raw: np.ndarray
    base: np.ndarray
    tol: Tolerance
    scale_hint: float
    hint_covers: bool


class Comparisons:
    """Tensor pairs :meth:`add`-ed (or comparisons :meth:`put` as made elsewhere), all decided by
    :meth:`made`, in the order given. Pairs are decided as soon as :data:`_CHUNK` elements wait: a pair's
    arrays are held no longer than that for its comparison (a step's gradients converted to the other
    side's layout are made for it, and let go once compared unless a lazy comparison keeps them)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._made: list[TensorDiff] = []
        self._waiting: list[_Pair | TensorDiff] = []
        self._size = 0  # elements waiting
        self._then: list[Callable[[], None]] = []  # told once what waits now is decided

    def when_decided(self, then: Callable[[], None]) -> None:
        """``then()`` once every pair added so far is decided (a live recording's pages read for them can go)."""
        if self._waiting:
            self._then.append(then)
        else:
            then()

    def __len__(self) -> int:
        return len(self._made) + len(self._waiting)

    def add(
        self, name: str, raw: np.ndarray, base: np.ndarray, tol: Tolerance, scale_hint: float = 0.0,
        hint_covers: bool = False,
    ) -> None:  # fmt: skip
        """``raw`` against ``base`` as ``compare_tensors(..., lazy=True)`` would compare them."""
        self._waiting.append(_Pair(name, raw, base, tol, scale_hint, hint_covers))
        self._size += raw.size
        if self._size >= _CHUNK:
            self._decide_waiting()

    def put(self, made: TensorDiff) -> None:
        """A comparison made otherwise (by statistics), in its place among the rest."""
        self._waiting.append(made)

    def decided(self, start: int, end: int) -> list[TensorDiff]:
        """The comparisons added from ``start`` to ``end``, once decided (in :meth:`when_decided`'s calls)."""
        return self._made[start:end]

    def made(self) -> list[TensorDiff]:
        """Every comparison, in the order added; the batch is empty again."""
        self._decide_waiting()
        made, self._made = self._made, []
        return made

    def _decide_waiting(self) -> None:
        pairs, self._waiting, self._size = self._waiting, [], 0
        out: list[TensorDiff | None] = [p if isinstance(p, TensorDiff) else None for p in pairs]
        together: dict[np.dtype, list[int]] = {}
        if self.mode == "strict" and len(pairs) >= _AT_ONCE:
            for i, p in enumerate(pairs):
                if isinstance(p, _Pair) and _alike(p.raw, p.base):
                    together.setdefault(p.raw.dtype, []).append(i)
        for indices in together.values():
            _decide(indices, pairs, out)
        for i, p in enumerate(pairs):
            if out[i] is None:
                assert isinstance(p, _Pair)
                out[i] = compare_tensors(p.name, p.raw, p.base, p.tol, self.mode, p.scale_hint, True, p.hint_covers)
        self._made += out  # type: ignore[arg-type]
        then, self._then = self._then, []
        for fn in then:
            fn()


def _alike(raw: np.ndarray, base: np.ndarray) -> bool:
    """Whether a pair can be decided with the rest: one float dtype, one shape, at least one axis, not empty,
    small enough to be compared alone in fresh arrays (as :func:`compare_tensors` would)."""
    return (
        raw.dtype == base.dtype
        and raw.dtype in _DTYPES
        and raw.shape == base.shape
        and raw.ndim > 0
        and 0 < raw.size <= FRESH_MAX
    )


def starts(arrays: list[np.ndarray]) -> np.ndarray:
    """Where each array begins in their concatenation."""
    at = np.zeros(len(arrays), dtype=np.intp)
    np.cumsum([a.size for a in arrays[:-1]], out=at[1:])
    return at


def chunks(indices: list[int], sizes: list[int]) -> list[list[int]]:
    """``indices`` cut into runs of at most :data:`_CHUNK` elements (``sizes[i]`` each), or of one."""
    out: list[list[int]] = [[]]
    size = 0
    for i in indices:
        n = sizes[i]
        if size + n > _CHUNK and out[-1]:
            out.append([])
            size = 0
        out[-1].append(i)
        size += n
    return out


def _decide(indices: list[int], pairs: list, out: list[TensorDiff | None]) -> None:
    """The pairs at ``indices`` (one dtype) that are bit-identical or within ``atol`` everywhere, decided;
    the rest left ``None`` for :func:`compare_tensors`."""
    chosen = [pairs[i] for i in indices]
    a = np.concatenate([p.raw.reshape(-1) for p in chosen])
    b = np.concatenate([p.base.reshape(-1) for p in chosen])
    at = starts([p.raw for p in chosen])
    with np.errstate(invalid="ignore"):  # inf - inf: such a pair is compared alone, which says so
        np.subtract(a, b, out=a)
    np.abs(a, out=a)
    worst = np.maximum.reduceat(a, at).tolist()
    # max |b| only where a pair's hint does not cover it; read for all in one pass all the same.
    magnitude = np.maximum.reduceat(np.abs(b, out=b), at).tolist() if not all(p.hint_covers for p in chosen) else None
    for j, (i, p) in enumerate(zip(indices, chosen)):
        w = worst[j]
        shapes = (tuple(p.base.shape), tuple(p.raw.shape))
        if w == 0.0:
            out[i] = identical(p.name, shapes, p.tol, "strict", "")
            continue
        if not math.isfinite(w):
            continue  # NaN/Inf: compared alone
        scale = p.scale_hint if p.hint_covers else max(magnitude[j], p.scale_hint)  # type: ignore[index]
        atol = absolute_tolerance(p.tol, scale)
        if w <= atol:
            out[i] = passed_lazily(p.name, shapes, w, p.tol, "strict", "", p.raw, p.base, atol)


def largest_magnitudes(arrays: list[np.ndarray]) -> list[float | None]:
    """``max |a|`` of each array, read in one pass over all of each dtype; ``None`` for one left to be
    read alone (holding NaN, empty, not float, large, or too few arrays to gain by it)."""
    out: list[float | None] = [None] * len(arrays)
    together: dict[np.dtype, list[int]] = {}
    if len(arrays) >= _AT_ONCE:
        for i, a in enumerate(arrays):
            if a.dtype in _DTYPES and a.ndim > 0 and 0 < a.size <= FRESH_MAX:
                together.setdefault(a.dtype, []).append(i)
    for indices in together.values():
        for chunk in chunks(indices, [a.size for a in arrays]):
            chosen = [arrays[i] for i in chunk]
            flat = np.concatenate([a.reshape(-1) for a in chosen])
            found = np.maximum.reduceat(np.abs(flat, out=flat), starts(chosen)).tolist()
            for i, m in zip(chunk, found):
                out[i] = m if m == m else None  # NaN: the largest of the rest, read alone
    return out
