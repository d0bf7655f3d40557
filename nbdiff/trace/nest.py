"""Flatten nested call arguments and outputs into named tensor leaves, and back.

Handles tuples, lists, dicts (including ``ModelOutput``-style ordered dicts) and
dataclasses. Non-tensor values stay in the template unchanged.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

__all__ = ["Leaf", "flatten", "flatten_call", "unflatten", "describe_non_tensors", "ONE_TENSOR_CALL"]


@dataclasses.dataclass(frozen=True)
class Leaf:
    """Placeholder for the ``index``-th tensor in a flattened structure."""

    index: int


def flatten(obj: Any, is_tensor: Callable[[Any], bool], prefix: str = "") -> tuple[list[tuple[str, Any]], Any]:
    """Return ``(leaves, template)``: named tensors in order, and the structure with placeholders."""
    leaves: list[tuple[str, Any]] = []
    return leaves, _flatten(obj, prefix, is_tensor, leaves)


def flatten_call(args: tuple, kwargs: dict, is_tensor: Callable[[Any], bool]) -> tuple[list[tuple[str, Any]], Any]:
    """:func:`flatten` of a call's ``(args, kwargs)``, without the walk for one positional tensor
    (most layer calls: this runs in the hook before every one)."""
    if not kwargs and len(args) == 1 and is_tensor(args[0]):
        return [("[0][0]", args[0])], ONE_TENSOR_CALL
    return flatten((args, kwargs), is_tensor)


# The walks are module functions, not recursive closures: a closure that calls itself is a
# reference cycle, and its cell kept the leaves (a layer's output tensors, with their autograd
# graphs) alive until the cyclic collector ran.
def _flatten(x: Any, key: str, is_tensor: Callable[[Any], bool], leaves: list[tuple[str, Any]]) -> Any:
    if is_tensor(x):
        leaves.append((key, x))
        return Leaf(len(leaves) - 1)
    if isinstance(x, dict):
        return {_TYPE: type(x), **{k: _flatten(v, f"{key}.{k}", is_tensor, leaves) for k, v in x.items()}}
    if isinstance(x, (tuple, list)):
        items = [_flatten(v, f"{key}[{i}]", is_tensor, leaves) for i, v in enumerate(x)]
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*items)
        return type(x)(items) if type(x) in (tuple, list) else list(items)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = dataclasses.fields(x)
        return {
            _PROTO: x,
            **{f.name: _flatten(getattr(x, f.name), f"{key}.{f.name}", is_tensor, leaves) for f in fields},
        }
    return x


_TYPE = "__nbdiff_type__"
_PROTO = "__nbdiff_dataclass__"
ONE_TENSOR_CALL = ((Leaf(0),), {_TYPE: dict})
"""The template :func:`flatten` makes of a call's ``(args, kwargs)`` with one positional tensor,
whose leaf is named ``[0][0]``: :func:`flatten_call` hands it out shared (never written)."""


def unflatten(template: Any, values: list[Any]) -> Any:
    """Rebuild a structure from :func:`flatten`'s template with new tensor ``values``."""
    if template is ONE_TENSOR_CALL:
        return (values[0],), {}
    return _build(template, values)


def _build(x: Any, values: list[Any]) -> Any:
    if isinstance(x, Leaf):
        return values[x.index]
    if isinstance(x, dict):
        items = {k: _build(v, values) for k, v in x.items() if k not in (_TYPE, _PROTO)}
        if _PROTO in x:
            return dataclasses.replace(x[_PROTO], **items)
        kind = x.get(_TYPE, dict)
        return items if kind is dict else kind(**items)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[_build(v, values) for v in x])
    if isinstance(x, (tuple, list)):
        return type(x)(_build(v, values) for v in x)
    return x


def describe_non_tensors(template: Any, limit: int = 80) -> tuple[str, ...]:
    """Short reprs of the non-tensor values inside a template, for the record."""
    out: list[str] = []
    _describe(template, "", limit, out)
    return tuple(out)


def _describe(x: Any, key: str, limit: int, out: list[str]) -> None:
    if isinstance(x, Leaf):
        return
    if isinstance(x, dict):
        for k, v in x.items():
            if k not in (_TYPE, _PROTO):
                _describe(v, f"{key}.{k}" if key else str(k), limit, out)
        return
    if isinstance(x, (tuple, list)):
        for i, v in enumerate(x):
            _describe(v, f"{key}[{i}]", limit, out)
        return
    text = repr(x)
    out.append(f"{key}={text if len(text) <= limit else text[: limit - 3] + '...'}")
