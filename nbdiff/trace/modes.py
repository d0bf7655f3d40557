"""Temporary changes to a model that are always undone: train/eval flags and dropout."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nbdiff.frameworks import Framework

__all__ = ["training_flags", "no_dropout", "eval_mode"]


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
def no_dropout(fw: Framework, model: Any) -> Iterator[None]:
    """Set every dropout probability to 0 so both sides compute the same thing; restore after."""
    saved: list[tuple[Any, str, Any]] = []
    try:
        for _, layer in fw.named_layers(model):
            for attr in fw.dropout_attrs(layer):
                saved.append((layer, attr, getattr(layer, attr)))
                setattr(layer, attr, 0.0)
        yield
    finally:
        for layer, attr, value in reversed(saved):
            setattr(layer, attr, value)
