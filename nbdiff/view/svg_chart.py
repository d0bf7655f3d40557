"""The step chart as static HTML: the static copy of the view has no script to draw it.

The same series, colours and log scale as the live view's chart (``js/view.js``, ``stepChart``), as an
SVG without text (where a sanitizer strips SVG, as JupyterLab does for an untrusted notebook, nothing
leaks), its scale said in HTML, and a table of the steps' worst errors that any renderer shows.
"""

from __future__ import annotations

import html
import math
from typing import Any

__all__ = ["step_chart_svg"]

SERIES = (("outputs", "#337ab7"), ("loss", "#8e44ad"), ("gradients", "#e67e22"), ("updates", "#27ae60"))
_W, _H, _L, _R, _T, _B = 520, 150, 44, 8, 8, 22


def step_chart_svg(rows: list[dict[str, Any]], first: int | None = None) -> str:
    """``rows``: :meth:`DiffResult.step_errors` (JSON-safe, ``1e300`` for inf); ``""`` for fewer than two steps."""
    values = [r[k] for r in rows for k, _ in SERIES if r.get(k) is not None]
    if len(rows) < 2 or not values:
        return ""
    lo = math.floor(math.log10(max(1e-6, min(1.0, *(max(v, 1e-6) for v in values)))))
    hi = math.ceil(math.log10(max(10.0, *(v for v in values if v < 1e299))))
    s0, s1 = min(r["step"] for r in rows), max(r["step"] for r in rows)

    def x(step: int) -> float:
        return _L + (step - s0) / max(1, s1 - s0) * (_W - _L - _R)

    def y(v: float) -> float:
        v = min(max(v, 1e-6), 10.0**hi)
        return _T + (1 - (math.log10(v) - lo) / (hi - lo)) * (_H - _T - _B)

    parts = []
    for e in range(lo, hi + 1):
        parts.append(
            f'<line x1="{_L}" x2="{_W - _R}" y1="{y(10.0**e):.1f}" y2="{y(10.0**e):.1f}" stroke="#ccc" stroke-width="0.5"/>'
        )
    parts.append(
        f'<line x1="{_L}" x2="{_W - _R}" y1="{y(1.0):.1f}" y2="{y(1.0):.1f}" stroke="#d9534f" stroke-dasharray="4 3"/>'
    )
    if first is not None:
        parts.append(
            f'<line x1="{x(first):.1f}" x2="{x(first):.1f}" y1="{_T}" y2="{_H - _B}" stroke="#d9534f" stroke-width="6" opacity="0.2"/>'
        )
    legend = []
    for key, colour in SERIES:
        pts = [(x(r["step"]), y(r[key])) for r in rows if r.get(key) is not None]
        if not pts:
            continue
        line = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        parts += [f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{colour}"/>' for a, b in pts]
        legend.append(f'<span style="color:{colour}">&#9679; {html.escape(key)}</span>')
    scale = (
        f"steps {s0} to {s1} left to right; log scale, a grid line per power of ten from 1e{lo} to 1e{hi}; "
        "dashed: the tolerance (1x)"
    )
    # Axis labels as HTML around the SVG (no text inside it): the top and bottom of the scale, the first and last step.
    edge = f'style="display:flex;justify-content:space-between;width:{_W}px;font-size:10px"'
    return (
        f'<div class="nbd-static-chart"><div style="font-size:11px">worst error / tolerance per step {" ".join(legend)}</div>'
        f'<div class="nbd-axis-top" {edge}><span>1e{hi} (error / tolerance, log)</span></div>'
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}">{"".join(parts)}</svg>'
        f'<div class="nbd-axis-bottom" {edge}><span>1e{lo} · step {s0}</span><span>step</span><span>step {s1}</span></div>'
        f'<div style="font-size:10px">{scale}</div>{_table(rows, first)}</div>'
    )


def _table(rows: list[dict[str, Any]], first: int | None, most: int = 12) -> str:
    """The steps' worst errors as a table: every step up to ``most``, else evenly spread ones, the
    first divergence's among them."""
    chosen = rows
    if len(rows) > most:
        picks = {round(i * (len(rows) - 1) / (most - 1)) for i in range(most)}
        chosen = [r for i, r in enumerate(rows) if i in picks or r["step"] == first]
    keys = [k for k, _ in SERIES if any(r.get(k) is not None for r in rows)]
    head = "".join(f"<th>{k}</th>" for k in keys)
    body = "".join(
        f"<tr><td>{r['step']}{' ◀' if r['step'] == first else ''}</td>"
        + "".join(f"<td>{_fmt(r.get(k))}</td>" for k in keys)
        + "</tr>"
        for r in chosen
    )
    return f'<table style="font-size:11px"><tr><th>step</th>{head}</tr>{body}</table>'


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    return "inf" if v >= 1e299 else f"{v:.3g}"
