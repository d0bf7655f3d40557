"""Temporary changes to a model that are always undone: train/eval flags and dropout."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from nbdiff.frameworks import Framework

__all__ = ["training_flags", "no_dropout", "eval_mode", "kept_state", "save_state", "save_weights", "restore_state"]

SavedState = list[tuple[Any, np.ndarray]]


def save_state(fw: Framework, model: Any) -> SavedState:
    """Copies of the non-trainable tensors (running statistics, counters) of a model or layer."""
    saved = []
    for _, layer in fw.named_layers(model):
        for _, t in fw.direct_params(layer) + fw.direct_buffers(layer):
            if fw.is_trainable(t):  # asked first: reading every weight cost a copy's bookkeeping each
                continue
            value = fw.to_numpy(t)
            # size 0: paddle RNN's dropout state, shape () but reads as (0,); nothing to keep.
            if value.size:
                saved.append((t, value.copy()))
    return saved


def save_weights(fw: Framework, model: Any) -> SavedState:
    """Copies of every parameter and buffer, trainable or not (to put a model back after a failure)."""
    return [
        (t, value.copy())
        for _, layer in fw.named_layers(model)
        for _, t in fw.direct_params(layer) + fw.direct_buffers(layer)
        if (value := fw.to_numpy(t)).size
    ]


def restore_state(fw: Framework, saved: SavedState) -> None:
    for t, a in saved:
        fw.set_value(t, a)


@contextmanager
def kept_state(fw: Framework, model: Any) -> Iterator[None]:
    """Restore the non-trainable tensors (running statistics) on exit."""
    saved = save_state(fw, model)
    try:
        yield
    finally:
        restore_state(fw, saved)


@contextmanager
def training_flags(fw: Framework, model: Any) -> Iterator[None]:
    """Restore every layer's train/eval flag on exit, whatever the body did."""
    saved = [(layer, fw.is_training(layer)) for _, layer in fw.named_layers(model)]
    try:
        yield
    finally:
        for layer, flag in saved:
            fw.set_training(layer, flag)


@contextmanager
def eval_mode(fw: Framework, model: Any) -> Iterator[None]:
    """Run in eval mode (so no running statistics change), then restore the flags."""
    with training_flags(fw, model):
        for _, layer in fw.named_layers(model):
            fw.set_training(layer, False)
        yield


@contextmanager
def no_dropout(fw: Framework, model: Any) -> Iterator[list[str]]:
    """Set the dropout probability of every dropout in training mode to 0, so both sides compute
    the same thing; restore after. In eval mode dropout is left alone: it is already off, and
    zeroing ``p`` would also remove paddle's ``downscale_in_infer`` eval scaling, a real difference.

    Besides dropout layers, a rate a layer's own code reads at call time is zeroed too (a float
    attribute named like ``attention_dropout``, as transformers' attention layers keep theirs).
    Yields what was turned off (``"layers.0.drop p=0.3"``), for telling the user."""
    saved: list[tuple[Any, str, Any]] = []
    off: list[str] = []
    try:
        for path, layer in fw.named_layers(model):
            if not fw.is_training(layer):
                continue
            for attr in dict.fromkeys((*fw.dropout_attrs(layer), *_dropout_rates(layer))):
                value = getattr(layer, attr)
                saved.append((layer, attr, value))
                setattr(layer, attr, 0.0)
                if isinstance(value, (int, float)) and value > 0:
                    off.append(f"{path or '<root>'}.{attr}={value:g}")
        yield off
    finally:
        for layer, attr, value in reversed(saved):
            setattr(layer, attr, value)


def _dropout_rates(layer: Any) -> list[str]:
    """A layer's own dropout rates: float attributes named ``*dropout*`` or ``*drop_prob*`` in (0, 1)."""
    return [
        name
        for name, value in vars(layer).items()
        # The value first: few attributes are floats, and this runs over every attribute of every layer.
        if type(value) is float and 0.0 < value < 1.0 and ("dropout" in name.lower() or "drop_prob" in name.lower())
    ]


@contextmanager
def kept_rng(fws: Iterable[Framework]) -> Iterator[None]:
    """The frameworks' random generators as they were: nbdiff seeds each step (both sides must draw the
    same), and the user's next draw must not be a seed-0 draw (``torch.random.fork_rng`` does this)."""
    saved = {fw.name: (fw, fw.rng_state()) for fw in fws}
    try:
        yield
    finally:
        for fw, state in saved.values():
            fw.set_rng_state(state)
