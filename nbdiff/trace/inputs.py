"""Turning the user's ``inputs`` into call arguments for each model, and calling it."""

from __future__ import annotations

from typing import Any

import numpy as np

from nbdiff.errors import InputError, ModelCallError
from nbdiff.frameworks import Framework
from nbdiff.frameworks.interrupts import is_interrupt
from nbdiff.trace.nest import flatten, unflatten

__all__ = ["CallArgs", "split_inputs", "call_model"]

CallArgs = tuple[tuple[Any, ...], dict[str, Any]]


def _as_call(x: Any) -> CallArgs:
    if isinstance(x, dict):
        return (), dict(x)
    if isinstance(x, tuple):
        return x, {}
    if isinstance(x, list):
        return tuple(x), {}
    return (x,), {}


def _convert(fw: Framework, call: CallArgs, model: Any) -> CallArgs:
    leaves, template = flatten(call, lambda v: isinstance(v, np.ndarray) or fw.is_tensor(v))
    device = fw.device_of(model) if model is not None and any(isinstance(v, np.ndarray) for _, v in leaves) else None
    values = [fw.from_numpy(v, device=device) if isinstance(v, np.ndarray) else v for _, v in leaves]
    return unflatten(template, values)


def split_inputs(
    inputs: Any, base_fw: Framework, raw_fw: Framework, models: tuple[Any, Any] = (None, None)
) -> tuple[CallArgs, CallArgs]:
    """``(base_call, raw_call)`` from a pair ``(base_inputs, raw_inputs)`` or one numpy array.

    Each element is a dict of keyword arguments, a tuple of positional ones or a
    single tensor; numpy arrays become tensors of the model's framework, on the device of
    ``models``' weights.
    """
    if isinstance(inputs, np.ndarray):
        inputs = (inputs, inputs)
    if not isinstance(inputs, (tuple, list)) or len(inputs) != 2:
        raise InputError(
            f"inputs must be a pair (base_inputs, raw_inputs), or one numpy array for both; got "
            f"{type(inputs).__name__}{f' of length {len(inputs)}' if isinstance(inputs, (tuple, list)) else ''}. "
            "Example: inputs=(torch_x, paddle_x) or inputs=({'x': torch_x}, {'x': paddle_x})."
        )
    calls = _convert(base_fw, _as_call(inputs[0]), models[0]), _convert(raw_fw, _as_call(inputs[1]), models[1])
    for side, call, fw in (("base", calls[0], base_fw), ("raw", calls[1], raw_fw)):
        tensors = flatten(call, fw.is_tensor)[0]
        if tensors and all(0 in fw.shape_of(t) for _, t in tensors):
            shapes = ", ".join(str(fw.shape_of(t)) for _, t in tensors[:3])
            raise InputError(
                f"the {side} inputs hold no values (every tensor is empty: {shapes}), so nothing can be compared; "
                "give at least one sample."
            )
    if base_fw.name != raw_fw.name:
        for side, call, fw, other in (("base", calls[0], base_fw, raw_fw), ("raw", calls[1], raw_fw, base_fw)):
            leaves, _ = flatten(call, lambda v, fw=fw, other=other: other.is_tensor(v) and not fw.is_tensor(v))
            if leaves:
                raise InputError(
                    f"the {side} inputs hold a {other.name} tensor (at {leaves[0][0]}), but the {side} model is "
                    f"{fw.name}. inputs is (base_inputs, raw_inputs): here ({base_fw.name} inputs, "
                    f"{raw_fw.name} inputs). Were they swapped?"
                )
    return calls


def call_model(model: Any, call: CallArgs, side: str) -> Any:
    """Call ``model`` and, if it raises, say which model while keeping the user's traceback."""
    args, kwargs = call
    try:
        return model(*args, **kwargs)
    except Exception as exc:
        if is_interrupt(exc):
            raise KeyboardInterrupt from None
        raise ModelCallError(
            f"The {side} model ({type(model).__name__}) raised {type(exc).__name__}: {exc}. "
            "The traceback above is your model's; nbdiff removed its hooks and restored the model."
        ) from exc
