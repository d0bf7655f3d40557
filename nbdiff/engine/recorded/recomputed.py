"""Layers recomputed from a dump, without the models: base's BatchNorm run on raw's inputs.

Offline, a layer's own error is judged from what it received. That fails for a layer that
amplifies: a train-mode BatchNorm over a few values per channel divides by their tiny spread,
so inputs that agree within tolerance come out differing past it. A BatchNorm is simple enough
to recompute in numpy from a tensor dump: base's scale and shift per channel follow from its
own input and output (a line fit over the channel's values, normalised by the batch's
statistics in train mode), and base's ``eps`` from the dump's ``layer_args``. Running that on
raw's inputs is the replay ``auto_diff`` makes (the same layer on the same inputs, the other
side), and running it once more on raw's inputs moved by one rounding unit measures the
layer's own sensitivity to rounding, as :mod:`nbdiff.engine.conditioning` does live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbdiff.trace.events import Event

__all__ = ["BatchNormCall", "batch_norm_of", "recorded_batch_norm", "read_off", "rounding_move"]

_FIT = 1e-3  # how closely the fitted line must give base's own output back, relative to its range


@dataclass(frozen=True)
class BatchNormCall:
    """Base's BatchNorm as its dump shows it: ``y = scale * normalised(x) + shift`` per channel."""

    scale: np.ndarray
    shift: np.ndarray
    eps: float
    train: bool
    """Normalised by the batch's own statistics (train mode); else an affine map (eval mode)."""
    axis: int

    def _normalised(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(x_hat, 1 / sigma)`` of channel-major values, in their dtype."""
        if not self.train:
            return c, np.ones((c.shape[0], 1), c.dtype)
        inv = 1 / np.sqrt(c.var(1, keepdims=True) + c.dtype.type(self.eps))
        return (c - c.mean(1, keepdims=True)) * inv, inv

    def forward(self, x: np.ndarray, dtype: type = np.float64) -> np.ndarray:
        """What base's layer gives for ``x``, computed in ``dtype``."""
        x_hat, _ = self._normalised(_by_channel(x, self.axis, dtype))
        return _from_channels(self.scale.astype(dtype) * x_hat + self.shift.astype(dtype), x.shape, self.axis)

    def backward(self, x: np.ndarray, grad_out: np.ndarray, dtype: type = np.float64) -> np.ndarray:
        """The gradient at its input for ``grad_out`` arriving at its output, on input ``x``, in ``dtype``."""
        x_hat, inv = self._normalised(_by_channel(x, self.axis, dtype))
        g = _by_channel(grad_out, self.axis, dtype)
        if self.train:  # the batch's statistics depend on every value
            g = g - g.mean(1, keepdims=True) - x_hat * (g * x_hat).mean(1, keepdims=True)
        return _from_channels(self.scale.astype(dtype) * inv * g, x.shape, self.axis)


def batch_norm_of(
    base: Event, eps: float, channels_last: bool = False, train: bool | None = None
) -> BatchNormCall | None:
    """Base's BatchNorm call read off its recorded (forward) input and output, in mode ``train`` (the
    dump's ``batch_norm_training``); ``None`` where the dump holds no values or the mode does not fit
    them. Within one call both modes fit (a batch's normalisation is affine in its input): an unknown
    mode (an older dump) is taken as train mode, where amplified rounding is at stake."""
    if not base.inputs or not base.outputs:
        return None
    x, y = base.inputs[0].value, base.outputs[0].value
    if x is None or y is None or x.shape != y.shape or x.ndim < 2 or x.size == 0:
        return None
    axis = x.ndim - 1 if channels_last else 1
    ys = _by_channel(y, axis)
    span = max(float(np.ptp(ys)), float(np.abs(ys).max()), 1e-30)
    for mode in (True, False) if train is None else (train,):
        call = BatchNormCall(np.ones(1), np.zeros(1), eps, mode, axis)
        x_hat, _ = call._normalised(_by_channel(x, axis))
        scale, shift = _line(x_hat, ys)
        if np.abs(scale * x_hat + shift - ys).max() <= _FIT * span:
            return BatchNormCall(scale, shift, eps, mode, axis)
    return None


def recorded_batch_norm(forward: Event, args: dict[str, Any], train: bool | None) -> BatchNormCall | None:
    """:func:`batch_norm_of` with the layer's recorded constructor arguments (``eps``, ``data_format``)."""
    eps = args.get("eps", 1e-5)
    channels_last = str(args.get("data_format", "")).upper().endswith("C")
    return batch_norm_of(forward, float(eps) if isinstance(eps, (int, float)) else 1e-5, channels_last, train)


def read_off(call: BatchNormCall, forward: Event) -> float:
    """How closely base's BatchNorm is known when read off its recorded call: its output moves this
    much (relative) from rounding its inputs, and the fitted scale carries that."""
    x, y = forward.inputs[0].value, forward.outputs[0].value
    top = float(np.abs(y).max(initial=0.0)) if y is not None else 0.0
    return rounding_move(call.forward, x) / top if x is not None and top > 0 else 0.0


def _by_channel(v: np.ndarray, axis: int, dtype: type = np.float64) -> np.ndarray:
    """``(channels, values)`` in ``dtype``."""
    return np.moveaxis(v.astype(dtype), axis, 0).reshape(v.shape[axis], -1)


def _from_channels(c: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray:
    moved = (shape[axis], *(s for i, s in enumerate(shape) if i != axis))
    return np.moveaxis(c.reshape(moved), 0, axis)


def _line(u: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per channel, ``a`` and ``b`` of the least-squares line ``y = a * u + b``."""
    du, dy = u - u.mean(1, keepdims=True), y - y.mean(1, keepdims=True)
    denom = (du * du).sum(1, keepdims=True)
    a = np.where(denom > 0, (du * dy).sum(1, keepdims=True) / np.where(denom > 0, denom, 1.0), 0.0)
    return a, y.mean(1, keepdims=True) - a * u.mean(1, keepdims=True)


def rounding_move(fn: Callable[[np.ndarray, type], np.ndarray], x: np.ndarray, seed: int = 0) -> float:
    """How far ``fn(x, dtype)`` moves from rounding: ``x`` moved by one unit of its dtype, or the
    computation done in that dtype (as the frameworks do) rather than in float64."""
    dtype = x.dtype.type if x.dtype.kind == "f" and x.dtype.itemsize <= 8 else np.float32
    u = np.random.RandomState(seed).uniform(-1.0, 1.0, x.shape)
    exact = fn(x, np.float64)
    moved = fn(x.astype(np.float64) * (1 + float(np.finfo(dtype).eps) * u), np.float64)
    return float(max(np.abs(moved - exact).max(), np.abs(fn(x, dtype).astype(np.float64) - exact).max()))
