"""The tensors a view row shows, found by the names its comparisons use, and their statistics.

A comparison names its own tensors (``out``, a gradient) and some that are not the event's: what
raw's code computed where single-step gave a layer base's input (``given:in[0]``), what a layer's
own code handed a sublayer (``proj:in[0]``). Both sides' records of each are found here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from nbdiff.judge.blame import EventDiff
from nbdiff.trace.events import Event, Phase, TensorRecord

__all__ = ["CallIndex", "json_ratio", "record_stats", "tensor_pair", "tensor_records", "scalar_value", "tensor_role"]


def json_ratio(x: float | None) -> float | None:
    if x is None:
        return None
    return x if math.isfinite(x) else 1e300  # JSON has no inf; the view shows it as "inf"


def record_stats(t: TensorRecord | None) -> dict[str, Any] | None:
    """Shape, dtype, min/max/mean/std and NaN/Inf counts of one recorded tensor, for the panel.

    From :meth:`TensorRecord.statistics`, so statistics-only dumps show them too.
    """
    if t is None:
        return None
    out: dict[str, Any] = dict(shape=list(t.shape), dtype=t.dtype)
    st = t.statistics()
    if st is not None:
        out.update({k: json_ratio(v) if isinstance(v, float) else v for k, v in st.as_dict().items()})
    return out


def _records(e: Event) -> dict[str, TensorRecord]:
    """An event's tensors by the names its comparisons use."""
    if e.phase is Phase.FORWARD:
        return {t.name: t for t in e.outputs}
    if e.phase is Phase.BACKWARD:
        return {t.name: t for t in (*e.inputs, *e.params)}
    return {t.name: t for t in e.outputs}


class CallIndex:
    """A result's forward calls by step, path and call index: a row's sublayer calls, found at once
    (a 10,000-row page asks for each parent's handful)."""

    def __init__(self, events: Sequence[EventDiff]) -> None:
        self._by: dict[tuple[int, int, str, int], EventDiff] = {}
        for o in events:
            e = o.base
            if e.phase is Phase.FORWARD:
                self._by.setdefault((e.rank, e.step, e.path, e.call), o)

    def child(self, d: EventDiff, label: str) -> EventDiff | None:
        """The sublayer call ``label`` (``path`` or ``path#call``) made in ``d``'s step."""
        path, _, call = label.partition("#")
        return self._by.get((d.base.rank, d.base.step, path, int(call) if call.isdigit() else 0))


def tensor_pair(d: EventDiff, name: str, calls: CallIndex | None = None) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Base and raw values of one compared tensor (``None`` where a side has none, or its layout differs);
    ``calls``: the result's, where the tensor is one a sublayer was handed."""
    b, r = tensor_records(d, name, calls)
    return (b.value if b is not None else None), (r.value if r is not None else None)


def tensor_records(
    d: EventDiff, name: str, calls: CallIndex | None = None
) -> tuple[TensorRecord | None, TensorRecord | None]:
    """Base's and raw's records of a tensor an event's comparisons name: its own (``out``, a
    gradient), what raw's code computed for the layer's input where single-step gave it base's
    (``given:in[0]``), or what a layer's own code handed a sublayer (``proj:in[0]``: base's from the
    sublayer's call; raw's from the replay on base's inputs, or from single-step)."""
    b, r = _records(d.base).get(name), _records(d.raw).get(name)
    if b is not None or r is not None or ":" not in name:
        return b, r
    owner, _, tensor = name.rpartition(":")
    if owner == "given":
        return _named(d.base.inputs, tensor), _named(d.raw.given, tensor)
    child = calls.child(d, owner) if calls is not None else None
    if child is None:
        return None, _named(d.evidence, name)
    return _named(child.base.inputs, tensor), _named(d.evidence, name) or _named(child.raw.given, tensor)


def _named(records: tuple[TensorRecord, ...], name: str) -> TensorRecord | None:
    return next((t for t in records if t.name == name), None)


def scalar_value(records: tuple[TensorRecord, ...]) -> float | None:
    t = records[0] if records else None
    if t is None or t.value is None or t.value.size != 1:
        st = t.statistics() if t is not None else None
        return None if st is None else json_ratio(st.mean)
    return json_ratio(float(t.value.reshape(-1)[0]))


def tensor_role(name: str) -> str:
    """What a tensor that is not the event's own is, in words."""
    owner, _, tensor = name.rpartition(":")
    if not owner:
        return ""
    if owner == "given":
        return f"what raw's own code computed for this layer's {tensor} (single-step gave it base's)"
    return f"what this layer's own code handed `{owner}` as {tensor}"
