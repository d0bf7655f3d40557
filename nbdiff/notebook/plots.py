"""Error plots for the tensor panel: PNG bytes drawn with matplotlib's object API.

``matplotlib.figure.Figure`` plus the Agg canvas: pyplot is never imported, so the
user's backend and open figures are left alone.
"""

from __future__ import annotations

import io

import numpy as np

__all__ = ["error_plots", "as_matrix"]

_MAX_CELLS = 256 * 256
"""Heatmaps larger than this are max-pooled down: the worst error stays visible."""


def as_matrix(x: np.ndarray) -> np.ndarray:
    """A 2-D view for a heatmap: trailing dimension as columns, the rest as rows."""
    if x.ndim == 0:
        return x.reshape(1, 1)
    if x.ndim == 1:
        return x.reshape(1, -1)
    return x.reshape(-1, x.shape[-1])


def _pool(m: np.ndarray) -> np.ndarray:
    rows, cols = m.shape
    fr = max(1, int(np.ceil(rows / 256)))
    fc = max(1, int(np.ceil(cols / 256)))
    if fr == 1 and fc == 1:
        return m
    pr, pc = (-rows) % fr, (-cols) % fc
    padded = np.pad(m, ((0, pr), (0, pc)))
    return padded.reshape(padded.shape[0] // fr, fr, padded.shape[1] // fc, fc).max(axis=(1, 3))


def _png(fig: object) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)  # type: ignore[arg-type]
    return buf.getvalue()


def error_plots(base: np.ndarray, raw: np.ndarray, title: str = "") -> dict[str, bytes]:
    """``{"histogram": png, "heatmap": png}`` of ``|raw - base|``."""
    from matplotlib.figure import Figure

    base, raw = np.asarray(base, dtype=np.float64), np.asarray(raw, dtype=np.float64)
    err = np.abs(raw.reshape(base.shape) - base)
    err = np.where(np.isfinite(err), err, np.nan)
    finite = err[np.isfinite(err)]
    out: dict[str, bytes] = {}

    fig = Figure(figsize=(3.6, 2.4), dpi=80)
    ax = fig.add_subplot()
    positive = finite[finite > 0]
    if positive.size:
        lo, hi = np.log10(positive.min()), np.log10(positive.max())
        bins = np.logspace(lo, hi if hi > lo else lo + 1, 40)
        ax.hist(positive, bins=list(bins), color="#d9534f")
        ax.set_xscale("log")
    ax.set_title(f"|raw - base| {title}".strip(), fontsize=8)
    ax.set_xlabel(f"{finite.size - positive.size} of {err.size} elements equal", fontsize=7)
    ax.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.14, right=0.97, top=0.88, bottom=0.2)  # tight_layout costs ~100 ms
    out["histogram"] = _png(fig)

    fig = Figure(figsize=(3.6, 2.4), dpi=80)
    ax = fig.add_subplot()
    m = as_matrix(err)
    if m.size > _MAX_CELLS:
        m = _pool(np.nan_to_num(m, nan=np.inf))
    image = ax.imshow(m, aspect="auto", cmap="magma", interpolation="nearest")
    fig.colorbar(image, ax=ax).ax.tick_params(labelsize=7)
    ax.set_title("error map (rows x last dim)", fontsize=8)
    ax.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.12, right=0.98, top=0.88, bottom=0.12)
    out["heatmap"] = _png(fig)
    return out
