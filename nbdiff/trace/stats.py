"""Summary statistics of one tensor: what statistics-only dumps keep and compare."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, fields

import numpy as np

__all__ = ["Stats", "tensor_stats", "STAT_FIELDS"]

STAT_FIELDS = ("min", "max", "mean", "std", "abs_mean")
"""The values a statistics comparison looks at, in this order."""
_CHUNK = 1 << 20  # elements per chunk: at most 8 MiB of scratch per thread, whatever the tensor's size
_ROW = 4096  # elements summed in the tensor's own float type before float64 takes over


@dataclass(frozen=True)
class Stats:
    """Moments over the finite elements, plus NaN/Inf counts."""

    min: float
    max: float
    mean: float
    std: float
    abs_mean: float
    """Mean of absolute values (what ``abs_mean`` compare mode uses)."""
    nan: int
    inf: int

    def as_dict(self) -> dict[str, float | int]:
        return {f: getattr(self, f) for f in _ALL_FIELDS}  # dataclasses.asdict deep-copies: slow

    def values(self) -> np.ndarray:
        return np.array([getattr(self, f) for f in STAT_FIELDS], dtype=np.float64)


def tensor_stats(a: np.ndarray) -> Stats:
    """Statistics of ``a`` (zeros for empty or non-numeric tensors).

    This runs on every recorded tensor of a dump, so it makes few passes and no large
    allocations: min and max (a NaN or Inf shows in them, so the finite mask is only built
    when one is there), then per chunk of ``_CHUNK`` elements a sum, ``|x|`` and ``x - mean``
    into one reused scratch buffer, their sums and a dot product. A sum adds rows of ``_ROW``
    elements in the tensor's float type (one BLAS matrix-vector product: faster than numpy's
    pairwise sum, and as exact) and the row sums in float64. The variance is two-pass, around
    the mean, so it does not cancel, and a constant tensor has a std of exactly 0 (a scalar
    loss got 7e-6 from ``E[x^2] - E[x]^2``).
    """
    x = np.asarray(a).ravel()
    if x.size == 0 or x.dtype.kind not in "biuf":
        return Stats(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)  # integers: exact up to 2**53
    elif x.itemsize < 4:
        x = x.astype(np.float32)  # float16 sums would round at every step
    lo, hi = float(x.min()), float(x.max())
    nan = inf = 0
    if not (math.isfinite(lo) and math.isfinite(hi)):
        finite = np.isfinite(x)
        nan = int(np.isnan(x).sum())
        inf = x.size - nan - int(finite.sum())
        x = x[finite]
        if x.size == 0:
            return Stats(0.0, 0.0, 0.0, 0.0, 0.0, nan, inf)
        lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        return Stats(lo, hi, lo, 0.0, abs(lo), nan, inf)
    n = x.size
    chunks = [x[i : i + _CHUNK] for i in range(0, n, _CHUNK)]
    mean = sum(_sum(c) for c in chunks) / n
    around = x.dtype.type(mean)
    abs_sum = square_sum = 0.0
    for c in chunks:
        scratch = _scratch(c.size, x.dtype)
        abs_sum += _sum(np.abs(c, out=scratch))
        np.subtract(c, around, out=scratch)
        square_sum += float(np.dot(scratch, scratch))
    shift = mean - float(around)  # the squares were taken around the mean rounded to x's type
    return Stats(lo, hi, mean, max(square_sum / n - shift * shift, 0.0) ** 0.5, abs_sum / n, nan, inf)


def _sum(c: np.ndarray) -> float:
    rows = c.size // _ROW * _ROW
    ones = _ones.get(c.dtype)
    if ones is None:
        ones = _ones[c.dtype] = np.ones(_ROW, c.dtype)
    head = float(np.add.reduce(c[:rows].reshape(-1, _ROW) @ ones, dtype=np.float64)) if rows else 0.0
    return head + float(np.add.reduce(c[rows:], dtype=np.float64))


_ones: dict[np.dtype, np.ndarray] = {}
_ALL_FIELDS = tuple(f.name for f in fields(Stats))
_buffers = threading.local()


def _scratch(size: int, dtype: np.dtype) -> np.ndarray:
    """A reused buffer per thread (a fresh one per tensor costs a page fault per 4 KiB)."""
    buf = getattr(_buffers, str(dtype), None)
    if buf is None or buf.size < size:
        buf = np.empty(max(size, 4096), dtype)
        setattr(_buffers, str(dtype), buf)
    return buf[:size]
