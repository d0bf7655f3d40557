"""Two tensors compared by what a statistics dump keeps of them: min, max, mean, std and mean |x|,
and how many NaN/Inf, where their values were not kept."""

from __future__ import annotations

import math

import numpy as np

from nbdiff.judge.metrics import TINY, TensorDiff, absolute_tolerance
from nbdiff.judge.shapes import broadcast_shape, positions_cut
from nbdiff.judge.tolerance import Tolerance
from nbdiff.trace.stats import Stats

__all__ = ["BY_STATISTICS", "compare_statistics"]


BY_STATISTICS = "compared by statistics"
"""What the note of a comparison made from a statistics dump says (its statistics, or its samples)."""


def compare_statistics(
    name: str,
    raw: Stats,
    base: Stats,
    tol: Tolerance,
    mode: str,
    base_shape: tuple[int, ...],
    raw_shape: tuple[int, ...],
    scale_hint: float = 0.0,
) -> TensorDiff:
    """Compare two tensors known only by their statistics (statistics-only dumps).

    Each of min, max, mean, std and mean-abs must agree within ``tol`` (a scaled
    ``atol`` is relative to the larger of ``|min|``, ``|max|``). ``mean`` and
    ``abs_mean`` modes look at that statistic only. NaN/Inf counts must be equal.
    """
    b, r = base.values(), raw.values()
    if mode == "mean":
        b, r = b[2:3], r[2:3]
    elif mode == "abs_mean":
        b, r = b[4:5], r[4:5]
    d = np.abs(r - b)
    atol = absolute_tolerance(tol, max(abs(base.min), abs(base.max), scale_hint))
    allowed = np.maximum(atol + tol.rtol * np.abs(b), TINY)
    ratio = float(np.max(d / allowed)) if d.size else 0.0
    note = BY_STATISTICS
    nb, nr = math.prod(base_shape), math.prod(raw_shape)
    if base.nan * nr != raw.nan * nb or base.inf * nr != raw.inf * nb:  # per element: counts scale with size
        ratio, note = np.inf, "NaN/Inf counts differ"
    if tuple(base_shape) != tuple(raw_shape):
        # As compare_tensors does: one side not yet expanded along size-1 axes, or the same values
        # in another shape. Neither changes min, max, mean, std or mean |x|.
        if positions_cut(tuple(raw_shape), tuple(base_shape)):
            # One side kept the last positions only (a generation step's logits): statistics of
            # every position say nothing of the last one's.
            ratio, note = (
                0.0,
                f"shape {tuple(raw_shape)} vs base {tuple(base_shape)}: one side keeps the last positions only; not comparable by statistics",
            )
        elif broadcast_shape(tuple(raw_shape), tuple(base_shape)) is None and nb != nr:
            ratio, note = np.inf, f"shape {tuple(raw_shape)} vs base {tuple(base_shape)}"
        elif note == BY_STATISTICS:
            note = f"shape {tuple(raw_shape)} vs base {tuple(base_shape)}, {BY_STATISTICS}"
    worst = float(d.max()) if d.size else 0.0
    rel = float(np.max(d / np.maximum(np.abs(b), TINY))) if d.size else 0.0
    return TensorDiff(
        name, tuple(base_shape), tuple(raw_shape), worst, rel, float(d.mean()) if d.size else 0.0, float("nan"),
        base.nan, raw.nan, base.inf, raw.inf, ratio, tol, mode, note,
    )  # fmt: skip
