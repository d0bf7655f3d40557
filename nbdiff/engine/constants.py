"""Constants of paired layers: non-persistent buffers (rotary ``inv_freq``, ``position_ids``).

They are computed in ``__init__`` from the constructor's arguments, so they are never
copied; a difference between two paired layers' constants is a finding about how the
layers were built (a rotary theta, a maximum length), reported with the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nbdiff.align.fused import FusedLayers
from nbdiff.frameworks import Framework
from nbdiff.judge.metrics import compare_tensors
from nbdiff.judge.tolerance import Tolerance

__all__ = ["constant_differences"]


def constant_differences(
    bfw: Framework,
    blayers: dict[str, Any],
    rfw: Framework,
    rlayers: dict[str, Any],
    pairs: list[tuple[str, str]],
    tol: Callable[[str, str], Tolerance],
) -> list[str]:
    """One line per constant buffer whose values differ between paired layers."""
    out = []
    for bp, rp in pairs:
        bl, rl = blayers.get(bp), rlayers.get(rp)
        if bl is None or rl is None or isinstance(bl, FusedLayers) or isinstance(rl, FusedLayers):
            continue
        names = bfw.constant_buffers(bl) | rfw.constant_buffers(rl)
        if not names:
            continue
        bb, rb = dict(bfw.direct_buffers(bl)), dict(rfw.direct_buffers(rl))
        for n in sorted(names):
            if n not in bb or n not in rb:
                continue
            b, r = bfw.to_numpy(bb[n]), rfw.to_numpy(rb[n])
            if b.dtype.kind not in "fiub" or r.dtype.kind not in "fiub":
                continue
            d = compare_tensors(n, r, b, tol(bfw.dtype_name(bb[n]), rfw.dtype_name(rb[n])))
            if not d.passed:
                out.append(
                    f"constant `{bp + '.' if bp else ''}{n}` differs from raw `{rp + '.' if rp else ''}{n}` "
                    f"(max abs {d.max_abs:.3g}{', ' + d.note if d.note else ''}): it is computed in __init__, "
                    "so compare the two layers' constructor arguments or configs."
                )
    return out
