"""Per-layer copy plans: which tensors of a base layer become which tensors of a raw layer."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from nbdiff.align.fused import FusedLayers
from nbdiff.errors import WeightTransferError
from nbdiff.frameworks import Framework
from nbdiff.weights.rules import Arrays, Convert, find_rule, rename_rule

__all__ = [
    "LayerWeights",
    "SAME_BY_NAME",
    "layer_tensors",
    "tensors_read_once",
    "plan_layer",
    "plan_by_classes",
    "all_class_names",
]

_ALIASES = {"scale": "weight", "_weight": "weight", "_mean": "running_mean", "_variance": "running_var"}
# Bookkeeping, not weights: a step counter, and paddle's RNN dropout state (shape () reading as (0,)).
_IGNORABLE = {"num_batches_tracked", "_dropout_state"}


SAME_BY_NAME = "same framework, by name"
"""The rule of a same-framework pair: every tensor goes to the one of the same relative name."""


@dataclass(frozen=True)
class LayerWeights:
    """How the tensors of one base layer map onto one raw layer."""

    base_path: str
    raw_path: str
    base_type: str
    raw_type: str
    rule: str
    """Name of the layout rule used, or how the tensors were matched."""
    recursive: bool
    """Covers the tensors of sublayers too."""
    convert: Convert
    """Base arrays (relative names) to raw arrays."""
    inverse: Convert
    """Raw arrays back to base arrays."""
    optional: tuple[str, ...] = ()
    """Raw tensors that may stay as they are."""
    copy: Any = None
    """``copy(base_layer, raw_layer)`` of a special-init rule, which writes raw itself."""


def all_class_names(layer: Any) -> list[str]:
    """Class names from the most specific to the framework's base layer class."""
    names = []
    for c in type(layer).__mro__:
        if c.__name__ in ("Module", "Layer", "object"):
            break
        names.append(c.__name__)
    return names


_memo: dict[int, tuple[Any, list[tuple[str, Any]]]] | None = None
"""While a plan is made (:func:`tensors_read_once`): each layer's own tensors, read once (a plan asks
about every layer several times: 23,000 reads for 4,000 layers, 0.4 s of ``auto_diff``'s 6)."""


@contextmanager
def tensors_read_once() -> Iterator[None]:
    """Within the block, a layer's own tensors are read once (the models do not change meanwhile)."""
    global _memo
    if _memo is not None:  # an enclosing plan's memo serves
        yield
        return
    _memo = {}
    try:
        yield
    finally:
        _memo = None


def _own_tensors(fw: Framework, layer: Any) -> list[tuple[str, Any]]:
    memo = _memo
    hit = memo.get(id(layer)) if memo is not None else None
    if hit is not None and hit[0] is layer:
        return hit[1]
    # Non-persistent buffers are constants computed in __init__, not weights: compared, never copied.
    constants = fw.constant_buffers(layer)
    found = fw.direct_params(layer) + [(n, b) for n, b in fw.direct_buffers(layer) if n not in constants]
    if memo is not None:
        memo[id(layer)] = (layer, found)  # the layer held: its id stays its own while the memo lives
    return found


def layer_tensors(fw: Framework, layer: Any, recursive: bool = False) -> dict[str, Any]:
    """Parameters and persistent buffers of a layer by relative name (dotted when ``recursive``)."""
    if isinstance(layer, FusedLayers):  # a fused group's members, each under its attribute name
        return {f"{m}.{n}": t for m, sub in layer.members.items() for n, t in layer_tensors(fw, sub, recursive).items()}
    if not recursive:
        return {n: t for n, t in _own_tensors(fw, layer) if n not in _IGNORABLE}
    out: dict[str, Any] = {}
    seen: set[int] = set()
    for path, sub in fw.named_layers(layer):
        prefix = f"{path}." if path else ""
        for n, t in _own_tensors(fw, sub):
            if id(t) not in seen and n not in _IGNORABLE:  # paddle RNN cells share their parent's parameters
                seen.add(id(t))
                out[prefix + n] = t
    return out


def plan_layer(bfw: Framework, bpath: str, blayer: Any, rfw: Framework, rpath: str, rlayer: Any) -> LayerWeights:
    """The copy plan for one pair of layers: a registered rule, or matching by name and shape."""
    btype, rtype = type(blayer).__name__, type(rlayer).__name__
    by_rule = _rule_plan(bfw.name, bpath, _as_rules_know(blayer), rfw.name, rpath, _as_rules_know(rlayer))
    if by_rule is not None:
        return replace(by_rule, base_type=btype, raw_type=rtype)
    if bfw.name == rfw.name:
        # A framework layer with the same tensors is copied whole, which covers sublayers that
        # never run as modules (torch MultiheadAttention's out_proj); user layers stay per layer.
        whole = False
        if bfw.is_library_layer(blayer) and rfw.is_library_layer(rlayer):
            bt, rt = layer_tensors(bfw, blayer, True), layer_tensors(rfw, rlayer, True)
            # (A layer without tensors, an activation, has nothing to copy: no plan of its own.)
            whole = bool(bt) and {n: bfw.shape_of(t) for n, t in bt.items()} == {
                n: rfw.shape_of(t) for n, t in rt.items()
            }
        return LayerWeights(bpath, rpath, btype, rtype, SAME_BY_NAME, whole, *rename_rule({}))
    return _by_name_and_shape(bfw, bpath, blayer, rfw, rpath, rlayer)


def _as_rules_know(layer: Any) -> list[str]:
    """The layer's class names, a router's with ``Linear`` after them: transformers' MoE routers
    (``Qwen2MoeTopKRouter``) hold a Linear's weight, ``[experts, hidden]``, and apply it by ``F.linear``."""
    names = all_class_names(layer)
    return [*names, "Linear"] if any(n.endswith("Router") for n in names) else names


def plan_by_classes(
    bfw: str, bpath: str, bclasses: list[str], rfw: str, rpath: str, rclasses: list[str]
) -> LayerWeights:
    """The plan of two recorded layers known by their class names (most specific first): their
    registered rule, else the same names (a dump holds no weights to match by shape)."""
    by_rule = _rule_plan(bfw, bpath, bclasses, rfw, rpath, rclasses)
    if by_rule is not None:
        return by_rule
    btype, rtype = (bclasses or ["?"])[0], (rclasses or ["?"])[0]
    return LayerWeights(bpath, rpath, btype, rtype, SAME_BY_NAME, False, *rename_rule({}))


def _rule_plan(
    bfw: str, bpath: str, bclasses: list[str], rfw: str, rpath: str, rclasses: list[str]
) -> LayerWeights | None:
    """The plan by the registered rule for these classes (most specific first), if there is one."""
    found = find_rule(bfw, bclasses, rfw, rclasses)
    if found is None:
        return None
    rule, inverted = found
    conv, inv = (rule.inverse, rule.convert) if inverted else (rule.convert, rule.inverse)
    btype, rtype = (bclasses or ["?"])[0], (rclasses or ["?"])[0]
    return LayerWeights(bpath, rpath, btype, rtype, rule.name, rule.recursive, conv, inv, rule.optional, rule.copy)


def _by_name_and_shape(
    bfw: Framework, bpath: str, blayer: Any, rfw: Framework, rpath: str, rlayer: Any
) -> LayerWeights:
    # A buffer that is a constant on either side (persistent on the other) is computed, not copied.
    constants = bfw.constant_buffers(blayer) | rfw.constant_buffers(rlayer)
    b = {n: bfw.shape_of(t) for n, t in layer_tensors(bfw, blayer).items() if n not in _IGNORABLE | constants}
    r = {n: rfw.shape_of(t) for n, t in layer_tensors(rfw, rlayer).items() if n not in _IGNORABLE | constants}
    mapping: dict[str, str] = {}
    canon_r = {_ALIASES.get(n, n): n for n in r}
    for n in b:
        c = _ALIASES.get(n, n)
        if c in canon_r:
            mapping[n] = canon_r.pop(c)
    left_b = [n for n in b if n not in mapping]
    left_r = list(canon_r.values())
    for n in left_b:
        for m in left_r:
            if sorted(b[n]) == sorted(r[m]):
                mapping[n] = m
                left_r.remove(m)
                break
    btype, rtype = type(blayer).__name__, type(rlayer).__name__
    fix = (
        f"register a rule: nbdiff.register_weight_rule(({bfw.name!r}, {btype!r}), ({rfw.name!r}, {rtype!r}), "
        "convert=..., inverse=...), or pair these layers differently in a LayerMap"
    )
    unmatched = [n for n in b if n not in mapping] + left_r
    if unmatched:
        raise WeightTransferError(
            f"Cannot match the tensors of base `{bpath}` ({btype}: {_shapes(b)}) with raw `{rpath}` "
            f"({rtype}: {_shapes(r)}) by name or shape: {unmatched} have no counterpart. Fix: {fix}."
        )
    for n, m in mapping.items():
        bs, rs = b[n], r[m]
        if bs == rs:
            if len(bs) == 2 and bs[0] == bs[1] and bs[0] > 1:
                warnings.warn(
                    f"nbdiff: square weight base `{bpath}.{n}` {bs} -> raw `{rpath}.{m}` copied as is; "
                    f"torch and paddle may store it transposed. If so, {fix}.",
                    stacklevel=4,
                )
        elif len(bs) == 2 and bs == rs[::-1]:
            raise WeightTransferError(
                f"Base `{bpath}.{n}` {bs} and raw `{rpath}.{m}` {rs} look transposed, but no rule says so "
                f"for {btype} -> {rtype}; nbdiff never transposes on a guess. Fix: {fix}."
            )
        else:
            raise WeightTransferError(
                f"Shape of base `{bpath}.{n}` {bs} does not match raw `{rpath}.{m}` {rs}. Fix: {fix}."
            )
    conv, inv = rename_rule(mapping)
    return LayerWeights(bpath, rpath, btype, rtype, "by name and shape", False, conv, inv)


def _shapes(d: dict[str, tuple[int, ...]]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "no tensors"


def convert_checked(plan: LayerWeights, arrays: Arrays, raw_shapes: dict[str, tuple[int, ...]]) -> Arrays:
    """Apply a plan to arrays and check every produced name and shape against raw."""
    out = plan.convert(arrays)
    for name, arr in out.items():
        if name not in raw_shapes:
            raise WeightTransferError(
                f"Rule {plan.rule!r} produced `{plan.raw_path}.{name}`, which raw {plan.raw_type} does not have "
                f"(it has: {', '.join(raw_shapes) or 'nothing'})."
            )
        if tuple(np.shape(arr)) != tuple(raw_shapes[name]):
            raise WeightTransferError(
                f"Shape of base `{plan.base_path}` ({plan.base_type}) converted by rule {plan.rule!r} is "
                f"{tuple(np.shape(arr))} for raw `{plan.raw_path}.{name}`, which is {tuple(raw_shapes[name])}. "
                "Fix: pair these layers differently in a LayerMap, or register a weight rule for them."
            )
    missing = [
        n for n in raw_shapes if n not in out and n not in plan.optional and n.rsplit(".", 1)[-1] not in _IGNORABLE
    ]
    if missing:
        raise WeightTransferError(
            f"Rule {plan.rule!r} gives no value for raw `{plan.raw_path}` tensors {missing} "
            f"from base `{plan.base_path}` ({plan.base_type}). Fix: register a weight rule that produces them."
        )
    return out
