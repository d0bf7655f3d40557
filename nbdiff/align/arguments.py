"""Constructor-level arguments of paired layers, and which ones differ: why two layers disagree.

Most porting bugs are an argument (an epsilon, BatchNorm momentum, GELU ``approximate``,
padding, a dropout mode), so the blame names it. Arguments are read from the layer
objects' attributes through a table kept as data: each canonical argument, the
attributes that hold it on each side, and how a value maps to the canonical meaning
(paddle's BatchNorm ``momentum`` is ``1 - m`` of torch's). No framework is imported.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbdiff.frameworks.base import plain_attr

__all__ = ["ArgDiff", "ARGUMENTS", "layer_arguments", "argument_diffs", "differing_arguments", "recorded_arguments"]


@dataclass(frozen=True)
class ArgDiff:
    """One argument whose meaning differs between the paired layers."""

    name: str
    base: Any
    raw: Any
    """Both in torch's meaning (a paddle BatchNorm ``momentum=0.9`` reads 0.1)."""

    def shown(self) -> tuple[str, str]:
        """Both values as text."""
        return _show(self.base), _show(self.raw)

    def describe(self) -> str:
        note = " (torch's meaning: paddle's momentum is 1 - m)" if self.name == "momentum" else ""
        return f"{self.name}: base {_show(self.base)}, raw {_show(self.raw)}{note}"


def _show(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else repr(v) if isinstance(v, str) else str(v)


def _ints(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v)
    return v


def _one_minus(v: Any) -> Any:
    return 1.0 - float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _approximate(v: Any) -> Any:
    return {"tanh": True, "none": False}.get(v, v) if isinstance(v, str) else v


def _fn_name(v: Any) -> Any:
    if isinstance(v, str):
        return v.lower()
    name = getattr(v, "__name__", None) or type(v).__name__
    return str(name).lower().lstrip("_")


_SAME: Callable[[Any], Any] = lambda v: v  # noqa: E731

# canonical name: (torch attributes, paddle attributes, paddle -> torch meaning, value normaliser,
#                  value a side means when it has no such attribute)
ARGUMENTS: dict[str, tuple[tuple[str, ...], tuple[str, ...], Callable[[Any], Any], Callable[[Any], Any], Any]] = {
    "eps": (("eps", "variance_epsilon", "epsilon"), ("_epsilon", "epsilon", "variance_epsilon", "eps"), _SAME, _SAME, None),
    "momentum": (("momentum",), ("_momentum",), _one_minus, _SAME, None),
    "approximate": (("approximate",), ("_approximate", "approximate"), _SAME, _approximate, None),
    "kernel_size": (("kernel_size",), ("_kernel_size",), _SAME, _ints, None),
    "stride": (("stride",), ("_stride",), _SAME, _ints, None),
    "padding": (("padding",), ("_padding",), _SAME, _ints, None),
    "dilation": (("dilation",), ("_dilation",), _SAME, _ints, None),
    "groups": (("groups",), ("_groups",), _SAME, _SAME, None),
    "padding_mode": (("padding_mode",), ("_padding_mode",), _SAME, _SAME, None),
    "align_corners": (("align_corners",), ("align_corners",), _SAME, _SAME, None),
    "dropout p": (("p",), ("p",), _SAME, _SAME, None),
    "dropout mode": ((), ("mode",), _SAME, _SAME, "upscale_in_train"),
    "num_heads": (("num_heads",), ("num_heads",), _SAME, _SAME, None),
    "negative_slope": (("negative_slope",), ("_negative_slope",), _SAME, _SAME, None),
    "normalized_shape": (("normalized_shape",), ("_normalized_shape",), _SAME, _ints, None),
    "activation": (("activation", "act_fn"), ("activation", "act_fn"), _SAME, _fn_name, None),
    "data_format": ((), ("_data_format", "data_format"), _SAME, _SAME, None),
}  # fmt: skip

_SCALARS = (bool, int, float, str, tuple, type(None))


def _read(layer: Any, attrs: tuple[str, ...], present: frozenset[str]) -> tuple[bool, Any]:
    """The first of ``attrs`` the layer has (``present``: :func:`_present`'s), and its value."""
    for a in attrs:
        if a in present:
            try:
                v = getattr(layer, a)
            except Exception:  # a property that needs state the layer does not have
                continue
            if isinstance(v, list):
                v = tuple(v)
            if isinstance(v, _SCALARS) or callable(v):
                return True, v
    return False, None


_NAMES = frozenset(a for t_attrs, p_attrs, *_ in ARGUMENTS.values() for a in (*t_attrs, *p_attrs))
_ON_CLASS: weakref.WeakKeyDictionary[type, frozenset[str]] = weakref.WeakKeyDictionary()
"""A layer class's attributes among :data:`_NAMES` (class attributes and properties), found once
per class: every layer's arguments are read for the result, 15-20 µs a layer when each name was
looked up on the instance and its class."""


def _present(layer: Any) -> frozenset[str]:
    """The argument attributes ``layer`` has: in its ``__dict__`` or on its class."""
    cls = type(layer)
    on_class = _ON_CLASS.get(cls)
    if on_class is None:
        on_class = _ON_CLASS[cls] = frozenset(a for a in _NAMES if hasattr(cls, a))
    own = getattr(layer, "__dict__", {})
    return on_class.union(a for a in _NAMES if a in own) if own else on_class


def _has(layer: Any, name: str) -> tuple[bool, Any]:
    """Whether ``layer`` has ``name`` (a parameter or buffer, or a :func:`plain_attr`), and its value;
    without the layer's ``__getattr__``, which raises inside for a name it lacks."""
    for store in (getattr(layer, "_parameters", None), getattr(layer, "_buffers", None)):
        if isinstance(store, dict) and name in store:
            return True, store[name]
    value = plain_attr(layer, name, _MISSING)
    return (False, None) if value is _MISSING else (True, value)


_MISSING = object()


def layer_arguments(framework: str, layer: Any) -> dict[str, Any]:
    """The canonical arguments ``layer`` has, in torch's meaning (paddle's momentum as ``1 - m``)."""
    out: dict[str, Any] = {}
    paddle = framework == "paddle"
    present = _present(layer)
    for name, (t_attrs, p_attrs, to_torch, norm, implicit) in ARGUMENTS.items():
        found, v = _read(layer, p_attrs if paddle else t_attrs, present)
        if not found:
            if implicit is not None and not paddle and name == "dropout mode" and _is_dropout(layer):
                out[name] = implicit
            continue
        if name == "activation" and hasattr(v, "forward"):
            v = type(v).__name__  # a module, not a function: its class names it
        if name == "dropout p" and not _is_dropout(layer):
            continue
        out[name] = norm(to_torch(v) if paddle else v)
    has_bias, bias = _has(layer, "bias")
    if has_bias and _has(layer, "weight")[1] is not None:
        out["bias"] = bias is not None
    return out


def _is_dropout(layer: Any) -> bool:
    return "dropout" in type(layer).__name__.lower()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    if isinstance(a, tuple) and isinstance(b, (int, tuple)) or isinstance(b, tuple) and isinstance(a, int):
        # padding=1 and padding=(1, 1) mean the same
        ta = a if isinstance(a, tuple) else (a,) * len(b)
        tb = b if isinstance(b, tuple) else (b,) * len(a)
        return ta == tb
    return a == b


def argument_diffs(base_fw: str, base_layer: Any, raw_fw: str, raw_layer: Any) -> list[ArgDiff]:
    """Arguments both layers have whose meanings differ (``[]`` when they agree or cannot be read)."""
    if base_layer is None or raw_layer is None:
        return []
    return differing_arguments(layer_arguments(base_fw, base_layer), layer_arguments(raw_fw, raw_layer))


def recorded_arguments(args: dict[str, Any]) -> dict[str, Any]:
    """What a dump keeps of :func:`layer_arguments` (JSON: numbers, strings, booleans and lists of
    them; a value JSON cannot hold is left out), and what reading it back gives (lists as tuples)."""
    plain = lambda v: v is None or isinstance(v, (bool, int, str)) or isinstance(v, float) and math.isfinite(v)  # noqa: E731
    out: dict[str, Any] = {}
    for k, v in args.items():
        if isinstance(v, (list, tuple)) and all(plain(x) for x in v):
            out[k] = tuple(v)
        elif plain(v):
            out[k] = v
    return out


def differing_arguments(a: dict[str, Any], b: dict[str, Any]) -> list[ArgDiff]:
    """The arguments of two layers (:func:`layer_arguments`, read live or from dumps) whose meanings differ."""
    out = [ArgDiff(k, a[k], b[k]) for k in a if k in b and not _same(a[k], b[k])]
    # torch layers are channels-first and say nothing; a channels-last paddle layer is a difference.
    last = lambda args: str(args.get("data_format", "")).upper().endswith("C")  # noqa: E731
    if ("data_format" in a) != ("data_format" in b) and (last(a) or last(b)):
        out.append(
            ArgDiff("data_format", a.get("data_format", "channels first"), b.get("data_format", "channels first"))
        )
    return out
