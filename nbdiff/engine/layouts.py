"""Recorded tensors of a base layer in raw's layout, by the pair's weight plan: values converted
as weights are, statistics carried through renames and transposes (not splits)."""

from __future__ import annotations

from typing import Any

import numpy as np

from nbdiff.trace.events import TensorRecord, dtype_name
from nbdiff.weights.plan import LayerWeights

__all__ = ["converted", "converted_records", "records_of"]


def converted(plan: LayerWeights | None, arrays: dict[str, Any]) -> dict[str, Any] | None:
    """Base arrays in raw's layout (``plan`` None: the same layout); None when the plan cannot convert them."""
    if plan is None:
        return dict(arrays)
    try:
        return plan.convert(dict(arrays))
    except (KeyError, ValueError):
        return None


def records_of(arrays: dict[str, np.ndarray]) -> tuple[TensorRecord, ...]:
    return tuple(TensorRecord(n, tuple(v.shape), dtype_name(v), v) for n, v in arrays.items())


def converted_records(plan: LayerWeights | None, records: tuple[TensorRecord, ...]) -> tuple[TensorRecord, ...]:
    """``records`` (one layer's parameter-level tensors) in raw's layout; those that cannot be are left out."""
    if not records or plan is None:
        return records
    if any(t.value is None for t in records):
        return _converted_stats(plan, records)
    out = converted(plan, {t.name: t.value for t in records})
    if out is None:
        return ()
    dtype = records[0].dtype
    return tuple(TensorRecord(n, tuple(v.shape), dtype, v) for n, v in out.items())


def _converted_stats(plan: LayerWeights, records: tuple[TensorRecord, ...]) -> tuple[TensorRecord, ...]:
    """Statistics survive renames and transposes, not splits: follow each tensor through the rule
    with a constant stand-in (tensor ``i`` filled with ``i``) and keep the outputs that are one
    whole tensor (made of it alone, and as large)."""
    # Broadcast views: no memory is allocated from a shape the (untrusted) dump claims.
    dummies = {t.name: np.broadcast_to(np.float64(i), t.shape) for i, t in enumerate(records)}
    out = converted(plan, dummies) or {}
    kept = []
    for name, arr in out.items():
        if arr.size == 0:
            continue
        if any(s != 0 for s in arr.strides):  # the rule copied (a reshape, a split, a concatenation)
            values = np.unique(arr)
            if values.size != 1:
                continue  # made of several tensors: no one tensor's statistics
        i = int(arr.flat[0])
        if 0 <= i < len(records) and arr.size == np.prod(records[i].shape):  # not a piece of it (a split)
            src = records[i]
            kept.append(TensorRecord(name, tuple(arr.shape), src.dtype, None, src.stats))
    return tuple(kept)
