"""Error plots for the tensor panel: PNG bytes drawn with matplotlib's object API.

``matplotlib.figure.Figure`` plus the Agg canvas: pyplot is never imported, so the
user's backend and open figures are left alone.
"""

from __future__ import annotations

import io

import numpy as np

__all__ = ["error_plots", "as_matrix", "step_chart"]

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


SERIES = ("outputs", "loss", "gradients", "updates")


def step_chart(rows: list[dict], first: int | None = None) -> object:
    """Error over tolerance per step (log scale), one line per series, the limit at 1."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 3.0), dpi=90)
    ax = fig.add_subplot()
    for name in SERIES:
        pts = [(r["step"], r[name]) for r in rows if r.get(name) is not None]
        if pts:
            steps, ys = zip(*pts)
            ax.plot(steps, [max(y, 1e-6) for y in ys], marker="o", label=name)
    ax.axhline(1.0, color="#a94442", linestyle="--", linewidth=1, label="tolerance")
    if first is not None:
        ax.axvline(first, color="#a94442", alpha=0.3, linewidth=6, label=f"first divergence (step {first})")
    ax.set_yscale("log")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("worst error / tolerance")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.subplots_adjust(left=0.11, right=0.98, top=0.95, bottom=0.16)
    # Shown as a cell's result without pyplot (which would take over the user's figures).
    fig._repr_png_ = lambda: _png(fig)  # type: ignore[attr-defined]
    return fig
