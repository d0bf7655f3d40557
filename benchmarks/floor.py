"""The floor of any recording or comparing tool: every layer hooked, each output and each output
gradient copied once. ``bench_overhead.py`` and ``bench_dump.py`` measure it beside nbdiff."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np
import paddle
import torch


@contextmanager
def each_output(model: Any, see: Callable[[Any], Any]) -> Iterator[None]:
    """While open, every float32 output of every layer of ``model`` (torch or paddle), and its
    gradient, is handed to ``see`` as the framework's tensor."""
    is_paddle = isinstance(model, paddle.nn.Layer)

    def keep(out: Any) -> None:
        if hasattr(out, "shape") and out.dtype in (torch.float32, paddle.float32):
            see(out)
            if (not out.stop_gradient) if is_paddle else out.requires_grad:
                out.register_hook(lambda g: keep(g))

    if is_paddle:
        handles = [m.register_forward_post_hook(lambda m, i, o: keep(o)) for m in [model, *model.sublayers()]]
    else:
        handles = [m.register_forward_hook(lambda m, i, o: keep(o)) for m in model.modules()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def copies_once(model: Any, on_copy: Callable[[np.ndarray], Any]) -> AbstractContextManager[None]:
    """Every float32 output of every layer, and its gradient, copied to the host once and handed to ``on_copy``."""
    return each_output(model, lambda t: on_copy(np.array(t.detach().numpy(), copy=True)))


def _framework_statistics(t: Any) -> tuple:
    """min, max, sum, sum of squares and sum of |x| of one tensor, reduced by its framework (its
    thread pool, no host copy), read back as five numbers."""
    t = t.detach()
    lo, hi = torch.aminmax(t) if isinstance(t, torch.Tensor) else (t.min(), t.max())
    return tuple(float(v) for v in (lo, hi, t.sum(), (t * t).sum(), t.abs().sum()))


def statistics_in_framework(model: Any) -> AbstractContextManager[None]:
    """Every float32 output of every layer, and its gradient, summarised by the framework itself
    (:func:`_framework_statistics`): what a statistics dump costs with no host copy."""
    return each_output(model, _framework_statistics)
