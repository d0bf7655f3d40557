"""A layer applying its activation itself against the same layer whose side calls the activation as a
function in the code after it (paddle's ``BatchNorm(act="relu")`` against torchvision DenseNet's
``features.norm5`` then ``F.relu``): which call that is, and its outputs with the activation applied,
so the two compare (:mod:`nbdiff.align.fused` makes the group).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from nbdiff.align.typemap import activation_kind, type_affinity
from nbdiff.trace.events import Event, TensorRecord

__all__ = ["ACTIVATIONS", "layer_then_code", "applied"]


def layer_then_code(base: list[Event], r: Event, act: str, used: set[int]) -> Event | None:
    """The first unused call of ``r``'s class and output shape whose next sibling call (if any) is no
    activation: its side applies ``r``'s activation, if at all, in its own code (a function), which
    :data:`ACTIVATIONS` repeats on its recorded outputs. Where that code leaves it out, the code after
    the layer is blamed, as it should be."""
    if activation_kind((act,)) not in ACTIVATIONS:
        return None
    shape = r.outputs[0].shape
    for i, b in enumerate(base):
        if b.order in used or not b.outputs or b.outputs[0].shape != shape:
            continue
        if type_affinity(b.type_name, b.bases, r.type_name, r.bases) < 2:
            continue
        after = next((e for e in base[i + 1 :] if e.parent == b.parent), None)
        if after is None or activation_kind((after.type_name, *after.bases)) is None:
            return b
    return None


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.maximum(x, 0),
    "relu6": lambda x: np.clip(x, 0, 6),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "silu": lambda x: x * _sigmoid(x),
}
"""Activations a side may apply as a function after a layer whose counterpart applies it itself, by kind."""


def applied(records: tuple[TensorRecord, ...], kind: str) -> tuple[TensorRecord, ...]:
    """``records`` with the activation applied (in float64, kept in each one's dtype); none where a value
    is not kept (a statistics dump: statistics do not carry through an activation, so the layer's output
    is not compared, and the next layer's input shows what the two sides hand on)."""
    fn = ACTIVATIONS[kind]
    out = []
    for t in records:
        if t.value is None:
            return ()
        if t.value.dtype.kind != "f":
            out.append(t)
            continue
        value = fn(t.value.astype(np.float64)).astype(t.value.dtype)
        out.append(TensorRecord(t.name, tuple(value.shape), t.dtype, value))
    return tuple(out)
