"""The floor of any recording or comparing tool: every layer hooked, each output and each output
gradient copied once. ``bench_overhead.py`` and ``bench_dump.py`` measure it beside nbdiff."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import numpy as np
import paddle
import torch


def _layers(model: Any) -> list[Any]:
    return [model, *model.sublayers()] if _is_paddle(model) else list(model.modules())


def _is_paddle(x: Any) -> bool:
    return isinstance(x, (paddle.nn.Layer, paddle.Tensor))


def _floating(t: Any) -> bool:
    return isinstance(t, (torch.Tensor, paddle.Tensor)) and t.dtype in (torch.float32, paddle.float32)


def _needs_grad(t: Any) -> bool:
    return (not t.stop_gradient) if _is_paddle(t) else t.requires_grad


@contextmanager
def _hooked(model: Any, pre: Callable[..., Any] | None, post: Callable[..., Any]) -> Iterator[None]:
    """While open, ``pre(layer, args, kwargs)`` and ``post(layer, args, kwargs, output)`` run around
    every layer call of ``model`` (torch or paddle)."""
    layers = _layers(model)
    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in layers] if pre is not None else []
    post_hook = "register_forward_post_hook" if _is_paddle(model) else "register_forward_hook"
    handles += [getattr(m, post_hook)(post, with_kwargs=True) for m in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def each_output(model: Any, see: Callable[[Any], Any]) -> AbstractContextManager[None]:
    """While open, every float32 output of every layer of ``model`` (torch or paddle), and its
    gradient, is handed to ``see`` as the framework's tensor."""

    def keep(out: Any) -> None:
        if _floating(out):
            see(out)
            if _needs_grad(out):
                out.register_hook(lambda g: keep(g))

    return _hooked(model, None, lambda m, args, kwargs, out: keep(out))


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


def each_call(model: Any, on_copy: Callable[[np.ndarray], Any]) -> AbstractContextManager[None]:
    """While open, every layer call of ``model`` (torch or paddle) has its float32 inputs (positional
    and keyword, inside tuples, lists and dicts) and outputs copied to the host, each input that needs
    a gradient its own autograd node (a view) with a gradient hook, each output a gradient hook, and
    each gradient copied: what recording a layer's own input gradient takes at the least, with
    nothing else kept (no names, no stacks, no records)."""

    def copy(t: Any) -> None:
        on_copy(np.array(t.detach().numpy(), copy=True))

    def given(a: Any) -> Any:
        """``a`` with each float32 tensor in it copied, and given its own node where it needs a gradient."""
        if _floating(a):
            copy(a)
            if _needs_grad(a):
                a = a.view(a.shape) if _is_paddle(a) else a.view_as(a)
                a.register_hook(lambda g: copy(g))
            return a
        if type(a) in (tuple, list):
            return type(a)(given(x) for x in a)
        if type(a) is dict:
            return {k: given(v) for k, v in a.items()}
        return a

    def made(o: Any) -> None:
        if _floating(o):
            copy(o)
            if _needs_grad(o):
                o.register_hook(lambda g: copy(g))
        elif isinstance(o, (tuple, list)):
            for x in o:
                made(x)
        elif isinstance(o, dict):  # a dict, or a transformers ModelOutput
            for x in o.values():
                made(x)

    return _hooked(model, lambda m, args, kwargs: (given(args), given(kwargs)), lambda m, args, kwargs, o: made(o))


def faithful(base: Any, raw: Any, run: Callable[[], Any]) -> int:
    """The faithful floor: ``run()`` (both models' step) with :func:`each_call` on both, then every
    copy compared with a tolerance (:func:`compared_with_tolerance`)."""
    kept: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    with each_call(base, kept[0].append), each_call(raw, kept[1].append):
        run()
    return compared_with_tolerance(*kept)


def compared_with_tolerance(base: list[np.ndarray], raw: list[np.ndarray]) -> int:
    """Pairs of equal shape compared as a tolerance needs at the least: ``max |a - b|`` against
    ``max |b|``, three numpy passes each. Returns how many passed."""
    passed = 0
    for a, b in zip(base, raw):
        if a.shape == b.shape:
            passed += float(np.abs(a - b).max()) <= 1e-5 * max(float(np.abs(b).max()), 1e-30)
    return passed
