"""The floor of any recording or comparing tool: every layer hooked, each output and each output
gradient copied once. ``bench_overhead.py`` and ``bench_dump.py`` measure it beside nbdiff."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import paddle
import torch


@contextmanager
def copies_once(model: Any, on_copy: Callable[[np.ndarray], Any]) -> Iterator[None]:
    """While open, every float32 output of every layer of ``model`` (torch or paddle), and its
    gradient, is copied to the host once and handed to ``on_copy``."""
    is_paddle = isinstance(model, paddle.nn.Layer)

    def keep(out: Any) -> None:
        if hasattr(out, "shape") and out.dtype in (torch.float32, paddle.float32):
            on_copy(np.array(out.detach().numpy(), copy=True))
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
