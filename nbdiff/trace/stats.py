"""Summary statistics of one tensor: what statistics-only dumps keep and compare."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["Stats", "tensor_stats", "STAT_FIELDS"]

STAT_FIELDS = ("min", "max", "mean", "std", "abs_mean")
"""The values a statistics comparison looks at, in this order."""


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
        return asdict(self)

    def values(self) -> np.ndarray:
        return np.array([getattr(self, f) for f in STAT_FIELDS], dtype=np.float64)


def tensor_stats(a: np.ndarray) -> Stats:
    """Statistics of ``a`` (zeros for empty or non-numeric tensors)."""
    x = np.asarray(a)
    if x.size == 0 or x.dtype.kind not in "biuf":
        return Stats(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
    xf = x.astype(np.float64, copy=False)
    if x.dtype.kind == "f":
        finite_mask = np.isfinite(xf)
        nan = int(np.isnan(xf).sum())
        inf = int(xf.size - nan - finite_mask.sum())
        finite = xf[finite_mask] if nan or inf else xf.ravel()
    else:
        nan = inf = 0
        finite = xf.ravel()
    if finite.size == 0:
        return Stats(0.0, 0.0, 0.0, 0.0, 0.0, nan, inf)
    return Stats(
        float(finite.min()), float(finite.max()), float(finite.mean()), float(finite.std()),
        float(np.abs(finite).mean()), nan, inf,
    )  # fmt: skip
