"""A step's gradient spreads (:class:`~nbdiff.engine.training.updates.GradientSpread`) widened together:
every parameter's in a few numpy passes over all of them, where each alone was eight small numpy calls.
Each array and number is what widening the parameter alone gives: the same elementwise operations,
and maxima, which no order changes."""

from __future__ import annotations

import numpy as np

from nbdiff.judge.bulk import chunks, starts

__all__ = ["Spread", "widened", "widened_together"]

Spread = tuple[np.ndarray, np.ndarray, float]
"""Per element, the largest difference between the gradients the two optimizers were given and the
largest gradient, over the steps so far; and the largest gradient of the last step folded in (what an
update of that step is proportional to, for SGD)."""
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def widened_together(spread: Spread | None, bg: np.ndarray, rg: np.ndarray) -> bool:
    """Whether one parameter's spread can be widened with the rest: both gradients of one float32 or
    float64 dtype and shape, not empty, and its spread so far (if any) of that dtype and shape too."""
    if not (bg.dtype == rg.dtype and bg.dtype in _DTYPES and bg.shape == rg.shape and bg.size > 0):
        return False
    return spread is None or (spread[0].shape == bg.shape and spread[0].dtype == bg.dtype)


def widened(pending: list[tuple[np.ndarray, np.ndarray, Spread | None]]) -> list[Spread]:
    """Each ``(base's gradient, raw's, spread so far)``'s spread widened by that step's gradients, in order
    (each :func:`widened_together`)."""
    out: list[Spread | None] = [None] * len(pending)
    by_dtype: dict[tuple[np.dtype, bool], list[int]] = {}
    for i, (bg, _, spread) in enumerate(pending):
        by_dtype.setdefault((bg.dtype, spread is None), []).append(i)
    sizes = [bg.size for bg, _, _ in pending]
    for (_, first), indices in by_dtype.items():
        for chunk in chunks(indices, sizes):
            _widen(chunk, pending, first, out)
    return out  # type: ignore[return-value]


def _widen(chunk: list[int], pending: list, first: bool, out: list[Spread | None]) -> None:
    chosen = [pending[i] for i in chunk]
    b = np.concatenate([bg.reshape(-1) for bg, _, _ in chosen])
    r = np.concatenate([rg.reshape(-1) for _, rg, _ in chosen])
    gap = np.abs(b - r)
    size = np.maximum(np.abs(b, out=b), np.abs(r, out=r))
    last = np.maximum.reduceat(size, starts([bg for bg, _, _ in chosen])).tolist()
    if not first:  # the widest so far, each element
        gap = np.maximum(np.concatenate([s[0].reshape(-1) for _, _, s in chosen]), gap)
        size = np.maximum(np.concatenate([s[1].reshape(-1) for _, _, s in chosen]), size)
    at = 0
    for j, (i, (bg, _, _)) in enumerate(zip(chunk, chosen)):
        n = bg.size
        out[i] = (gap[at : at + n].reshape(bg.shape), size[at : at + n].reshape(bg.shape), last[j])
        at += n
