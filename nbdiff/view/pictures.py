"""The data of the panel's error pictures, drawn by the browser: a histogram and an error map.

Small enough to go with the panel itself (so they appear with it, in the page's theme)
and to embed for every row of an HTML report: a log-binned histogram of ``|raw - base|``
and the error map max-pooled to a few hundred cells, quantised to 0..255 on a log scale.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbdiff.judge.metrics import elementwise_error
from nbdiff.judge.shapes import as_compared

__all__ = ["error_picture", "as_matrix", "pool", "BINS", "MAP_ROWS", "MAP_COLS"]

BINS = 32
"""Histogram bins, evenly spaced in log10 of the error."""
MAP_ROWS, MAP_COLS = 24, 48
"""The error map is max-pooled down to at most this many cells: the worst error stays visible."""


def as_matrix(x: np.ndarray) -> np.ndarray:
    """A 2-D view for an error map: trailing dimension as columns, the rest as rows."""
    if x.ndim == 0:
        return x.reshape(1, 1)
    if x.ndim == 1:
        return x.reshape(1, -1)
    return x.reshape(-1, x.shape[-1])


def pool(m: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Max-pool a matrix down to at most ``rows`` x ``cols``."""
    fr = max(1, -(-m.shape[0] // rows))
    fc = max(1, -(-m.shape[1] // cols))
    if fr == 1 and fc == 1:
        return m
    padded = np.pad(m, ((0, (-m.shape[0]) % fr), (0, (-m.shape[1]) % fc)))
    return padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc).max(axis=(1, 3))


def error_picture(base: np.ndarray, raw: np.ndarray, passed: bool) -> dict[str, Any] | None:
    """Histogram and error map of ``|raw - base|`` as plain JSON, or ``None`` when not comparable."""
    laid = as_compared(np.asarray(raw), np.asarray(base))
    if laid is None or laid[1].size == 0:
        return None
    raw, base = laid
    # Judged as the comparison judges it: the same NaN/Inf on both sides, or an infinity against a mask
    # value of its sign, is no error; NaN against a number is the worst there is. At least 1-D: a scalar
    # (the loss) is a one-element picture.
    judged, masked = elementwise_error(raw, base)
    err = np.array(judged, dtype=np.float64, ndmin=1)
    bad = ~np.isfinite(err)
    err[bad] = np.inf
    finite = err[~bad]
    positive = finite[finite > 0]
    if positive.size:
        lo, hi = float(np.log10(positive.min())), float(np.log10(positive.max()))
        hi = hi if hi > lo else lo + 1.0
        counts = np.histogram(np.log10(positive), bins=BINS, range=(lo, hi))[0]
    else:
        lo, hi, counts = 0.0, 1.0, np.zeros(BINS, dtype=np.int64)
    cells = pool(as_matrix(err), MAP_ROWS, MAP_COLS)
    with np.errstate(divide="ignore"):
        logs = np.log10(cells)
    level = np.where(cells > 0, np.clip(np.round((logs - lo) / (hi - lo) * 255), 0, 255), -1)
    level = np.where(np.isinf(cells), 256, level)  # non-finite: drawn apart
    return dict(
        passed=bool(passed), total=int(err.size), zeros=int(finite.size - positive.size), nonfinite=int(bad.sum()),
        masked=masked,
        lo=lo, hi=hi, counts=[int(c) for c in counts],
        rows=int(cells.shape[0]), cols=int(cells.shape[1]), cells=[int(v) for v in level.ravel()],
        shape=[int(n) for n in base.shape],
    )  # fmt: skip
