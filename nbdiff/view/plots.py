"""Figures to save and share: the per-step error chart and the blamed tensor's error, drawn with
matplotlib's object API (the notebook view draws its own pictures in the browser).

``matplotlib.figure.Figure`` plus the Agg canvas: pyplot is never imported, so the
user's backend and open figures are left alone.
"""

from __future__ import annotations

import io

import numpy as np

from nbdiff.judge.shapes import as_compared
from nbdiff.view.pictures import as_matrix, pool

__all__ = ["error_figure", "step_chart"]

_MAX_CELLS = 256 * 256
"""Error maps larger than this are max-pooled down: the worst error stays visible."""


def _png(fig: object) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)  # type: ignore[arg-type]
    return buf.getvalue()


def error_figure(base: np.ndarray, raw: np.ndarray, title: str = "") -> object:
    """A matplotlib figure of ``|raw - base|``: log histogram and error map (rows x last dim), to save
    or share; the notebook view draws its own in the browser (:mod:`nbdiff.view.pictures`)."""
    from matplotlib.figure import Figure

    base, raw = np.asarray(base, dtype=np.float64), np.asarray(raw, dtype=np.float64)
    raw, base = as_compared(raw, base) or (raw.reshape(base.shape), base)
    err = np.abs(raw - base)
    err = np.where(np.isfinite(err), err, np.nan)
    finite = err[np.isfinite(err)]
    fig = Figure(figsize=(7.2, 2.6), dpi=90)
    hist, heat = fig.subplots(1, 2)
    positive = finite[finite > 0]
    if positive.size:
        lo, hi = np.log10(positive.min()), np.log10(positive.max())
        bins = np.logspace(lo, hi if hi > lo else lo + 1, 40)
        hist.hist(positive, bins=list(bins), color="#d9534f")
        hist.set_xscale("log")
    hist.set_title(f"|raw - base| {title}".strip(), fontsize=8)
    hist.set_xlabel(f"{finite.size - positive.size} of {err.size} elements equal", fontsize=7)
    hist.tick_params(labelsize=7)
    m = as_matrix(err)
    if m.size > _MAX_CELLS:
        m = pool(np.nan_to_num(m, nan=np.inf), 256, 256)
    image = heat.imshow(m, aspect="auto", cmap="magma", interpolation="nearest")
    fig.colorbar(image, ax=heat).ax.tick_params(labelsize=7)
    heat.set_title("error map (rows x last dim)", fontsize=8)
    heat.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.07, right=0.98, top=0.88, bottom=0.2, wspace=0.25)  # tight_layout costs ~100 ms
    fig._repr_png_ = lambda: _png(fig)  # type: ignore[attr-defined]
    return fig


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
