"""Fused layers: one raw layer doing the work of several base layers.

A port often fuses projections that the original keeps apart: paddleformers' ``qkv_proj``
for ``q_proj``/``k_proj``/``v_proj``, ``up_gate_proj`` for ``gate_proj``/``up_proj``.
The members all read the same input, and the fused layer's output features are the
members' output features in some order: concatenated (``[gate | up]``), or interleaved
per key/value head (paddleformers' attention reshapes ``qkv`` to ``[kv heads, (q per kv
+ 2) * head_dim]``). A :class:`FusedLayout` is that order, as an index, so one
definition converts weights, biases, gradients and outputs alike.

Either side may hold the fused layer. A layer whose activation the raw layer applies itself (paddle's ``BatchNorm(act="relu")``
against ``BatchNorm2d`` then ``ReLU``) is a sequential group: in at the first, out at the last.

Before pairing, each fused raw call takes the members' calls as one base event whose
outputs are the members' outputs in the raw layout; everything after pairing (weights,
forward and backward comparison, single-step feeding, updates) sees one pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from nbdiff.align.fused_activation import applied, layer_then_code
from nbdiff.align.typemap import activation_kind, type_affinity
from nbdiff.frameworks.base import plain_attr
from nbdiff.trace.events import Event, TensorRecord
from nbdiff.trace.stats import concatenated_stats

__all__ = [
    "FusedLayout",
    "FusedPattern",
    "FusedGroup",
    "FusedLayers",
    "FUSED_PATTERNS",
    "register_fused_pattern",
    "find_fused_groups",
    "group_path",
    "parent_path",
    "fuse_events",
    "concat_layout",
    "per_kv_head_layout",
    "LAYOUT_FACTS",
    "layout_facts",
    "stand_ins",
    "member_name",
]


@dataclass(frozen=True)
class FusedLayout:
    """Where each output feature of the fused layer comes from."""

    name: str
    sizes: tuple[int, ...]
    """Output features of each member, in member order."""
    index: np.ndarray = field(repr=False, compare=False)
    """Fused feature ``j`` is feature ``index[j]`` of the members' outputs concatenated."""

    def fuse(self, parts: list[np.ndarray], axis: int) -> np.ndarray:
        return np.take(np.concatenate(parts, axis=axis), self.index, axis=axis)

    def split(self, whole: np.ndarray, axis: int) -> list[np.ndarray]:
        back = np.take(whole, np.argsort(self.index), axis=axis)
        return np.split(back, np.cumsum(self.sizes)[:-1], axis=axis)


def concat_layout(sizes: tuple[int, ...]) -> FusedLayout:
    """The members' features one after another: ``[gate | up]``, ``[q | k | v]``."""
    return FusedLayout("concatenated", sizes, np.arange(sum(sizes)))


def per_kv_head_layout(sizes: tuple[int, ...], kv_heads: int) -> FusedLayout | None:
    """``[q heads of kv head 0, k head 0, v head 0, q heads of kv head 1, ...]`` (grouped-query
    attention fused per key/value head), or ``None`` when the sizes do not fit."""
    if len(sizes) != 3 or kv_heads <= 0 or sizes[1] != sizes[2] or sizes[1] % kv_heads:
        return None
    head_dim = sizes[1] // kv_heads
    q_per_kv = sizes[0] // head_dim // kv_heads
    if q_per_kv * kv_heads * head_dim != sizes[0]:
        return None
    parts = []
    for h in range(kv_heads):
        parts.append(np.arange(h * q_per_kv * head_dim, (h + 1) * q_per_kv * head_dim))
        parts.append(sizes[0] + np.arange(h * head_dim, (h + 1) * head_dim))
        parts.append(sizes[0] + sizes[1] + np.arange(h * head_dim, (h + 1) * head_dim))
    return FusedLayout(f"q|k|v per kv head ({kv_heads} kv heads of {head_dim})", sizes, np.concatenate(parts))


LayoutFn = Callable[[tuple[int, ...], Any], "FusedLayout | None"]
"""``(member sizes, the fused layer's parent layer) -> layout``; ``None``: cannot tell."""


@dataclass(frozen=True)
class FusedPattern:
    """Names that say a raw layer fuses base layers, and how its features are laid out."""

    members: tuple[str, ...]
    """Attribute names of the base layers, in the fused layout's member order."""
    fused: tuple[str, ...]
    """Attribute names the fused raw layer goes by."""
    layout: LayoutFn


FUSED_PATTERNS: list[FusedPattern] = []


def register_fused_pattern(members: tuple[str, ...], fused: tuple[str, ...], layout: LayoutFn | None = None) -> None:
    """Teach nbdiff that a raw layer named one of ``fused`` does the work of base sibling layers
    named ``members`` (same input, outputs fused). ``layout(sizes, parent)`` gives the order of
    the fused output features; the default concatenates the members in the order given."""
    FUSED_PATTERNS.insert(0, FusedPattern(tuple(members), tuple(fused), layout or (lambda s, _p: concat_layout(s))))


LAYOUT_FACTS = ("_act", "num_key_value_heads", "num_kv_heads")
"""What pairing reads of a layer besides its calls (the activation it applies itself, the key/value
heads a fused qkv is laid out by): a dump keeps them, so recorded steps pair as live ones do."""


def layout_facts(layer: Any) -> dict[str, str | int]:
    """The layer's :data:`LAYOUT_FACTS` (its own, else its ``config``'s) and its class's module; ``{}``
    when it has none."""
    out: dict[str, str | int] = {}
    for n in LAYOUT_FACTS:
        for holder in (layer, getattr(layer, "config", None)):
            v = getattr(holder, n, None) if holder is not None else None
            if isinstance(v, (str, int)) and not isinstance(v, bool):
                out[n] = v
                break
    return {"module": type(layer).__module__, **out} if out else {}


def stand_ins(classes: dict[str, list[str]], facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Objects standing in for recorded layers (path -> class names, most specific first), with the
    facts recorded of them: what pairing reads of a live layer."""
    made: dict[tuple[str, str], type] = {}
    out = {}
    for path, names in classes.items():
        known = facts.get(path, {})
        key = (names[0] if names else "Layer", str(known.get("module", "")))
        cls = made.get(key) or made.setdefault(key, type(key[0], (), {"__module__": key[1]}))
        layer = cls()
        for n in LAYOUT_FACTS:
            if isinstance(known.get(n), (str, int)):
                setattr(layer, n, known[n])
        out[path] = layer
    return out


def _attr(layer: Any, *names: str) -> int | None:
    for holder in (layer, getattr(layer, "config", None)):
        for n in names:
            v = getattr(holder, n, None) if holder is not None else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


# Libraries whose fused qkv is laid out per key/value head (they reshape it to
# [kv heads, (q per kv + 2) * head_dim] before splitting), and their exceptions.
PER_KV_HEAD_LIBRARIES = {"paddleformers": ("Phi3Attention",)}


def _qkv_layout(sizes: tuple[int, ...], parent: Any) -> FusedLayout | None:
    cls = type(parent)
    library = cls.__module__.split(".")[0]
    if library in PER_KV_HEAD_LIBRARIES and cls.__name__ not in PER_KV_HEAD_LIBRARIES[library]:
        kv = _attr(parent, "num_key_value_heads", "num_kv_heads")
        return per_kv_head_layout(sizes, kv) if kv else None
    return concat_layout(sizes)


for _members in (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"), ("q", "k", "v")):
    FUSED_PATTERNS.append(FusedPattern(_members, ("qkv_proj", "qkv", "query_key_value", "c_attn", "Wqkv"), _qkv_layout))
FUSED_PATTERNS.append(
    FusedPattern(("gate_proj", "up_proj"), ("up_gate_proj", "gate_up_proj"), lambda s, _p: concat_layout(s))
)


@dataclass(frozen=True)
class FusedGroup:
    """Layer calls of one side that one call of the other side fuses."""

    path: str
    """The group's path: the members' parent, then their names joined by ``+``."""
    members: tuple[str, ...]
    """Paths of the members, in layout order."""
    calls: tuple[int, ...]
    """Each member's call index."""
    fused_path: str
    """The fused layer, on the other side."""
    layout: FusedLayout | None
    """``None`` for a sequential group."""
    sequential: bool = False
    """A layer then its activation, which the raw layer applies itself (paddle ``BatchNorm(act=...)``):
    the group's input is the first member's, its output the last member's."""
    side: str = "base"
    """Where the members are: ``base`` (the usual port: raw fuses them) or ``raw``."""
    applied: str = ""
    """For a layer alone whose activation its side applies as a function in the code after it (torchvision's
    DenseNet: ``features.norm5`` then ``F.relu``), against a layer applying it itself: that activation's kind,
    applied to the member's recorded outputs so the two compare."""


class FusedLayers:
    """The member layers of a fused group, standing in for one base layer (weights and gradients)."""

    def __init__(self, members: dict[str, Any]) -> None:
        self.members = members
        """Attribute name -> layer, in layout order."""

    def __repr__(self) -> str:
        return f"FusedLayers({', '.join(self.members)})"


def group_path(members: tuple[str, ...]) -> str:
    """``a.b.q_proj+k_proj+v_proj``: the siblings' parent once, then their names."""
    parent = parent_path(members[0])
    return (f"{parent}." if parent else "") + "+".join(member_name(m) for m in members)


def member_name(path: str) -> str:
    """A layer's attribute name in its parent: what a fused group calls its member."""
    return path.rsplit(".", 1)[-1]


def parent_path(path: str) -> str:
    """The path of a layer's parent (``""``: the root's)."""
    return path.rsplit(".", 1)[0] if "." in path else ""


def _features(e: Event) -> tuple[tuple[int, ...], int] | None:
    if len(e.outputs) != 1 or not e.outputs[0].shape:
        return None
    shape = tuple(e.outputs[0].shape)
    return shape[:-1], shape[-1]


def find_fused_groups(
    base: list[Event], raw: list[Event], raw_layers: dict[str, Any], base_layers: dict[str, Any] | None = None
) -> list[FusedGroup]:
    """Fused layers of either side and the calls of the other side they fuse, in execution order.

    A call named as a pattern's fused layer takes the next unused calls of sibling layers
    named as its members on the other side, when the shapes say so: same leading dimensions,
    and output features adding up to the fused layer's. A layer that applies its activation
    itself (``_act``) takes the next layer of its class followed by that activation.
    """
    groups = _groups_for(raw, base, raw_layers, "base")
    if base_layers is not None:
        groups += _groups_for(base, raw, base_layers, "raw")
    return groups


def _groups_for(
    fused_side: list[Event], members_side: list[Event], layers: dict[str, Any], side: str
) -> list[FusedGroup]:
    groups: list[FusedGroup] = []
    used: set[int] = set()
    for r in fused_side:
        rf = _features(r)
        if rf is None:
            continue
        act = plain_attr(layers.get(r.path), "_act")
        if isinstance(act, str) and act:
            found_seq = _layer_then_activation(members_side, r, act, used)
            if found_seq is not None:
                used.update(e.order for e in found_seq)
                paths = tuple(e.path for e in found_seq)
                calls = tuple(e.call for e in found_seq)
                groups.append(FusedGroup(group_path(paths), paths, calls, r.path, None, True, side))
            elif (alone := layer_then_code(members_side, r, act, used)) is not None:
                used.add(alone.order)
                kind = activation_kind((act,)) or act
                groups.append(
                    FusedGroup(f"{alone.path}+{kind}", (alone.path,), (alone.call,), r.path, None, True, side, kind)
                )
            continue
        for pattern in FUSED_PATTERNS:
            if member_name(r.path) not in pattern.fused:
                continue
            found = _next_members(members_side, pattern.members, used, rf)
            if found is None:
                continue
            sizes = tuple(_features(e)[1] for e in found)  # type: ignore[index]
            layout = pattern.layout(sizes, layers.get(parent_path(r.path)))
            if layout is None:
                continue
            used.update(e.order for e in found)
            paths = tuple(e.path for e in found)
            groups.append(FusedGroup(group_path(paths), paths, tuple(e.call for e in found), r.path, layout, side=side))
            break
    return groups


def _layer_then_activation(base: list[Event], r: Event, act: str, used: set[int]) -> list[Event] | None:
    """The first unused base call of ``r``'s class followed by a sibling activation of kind ``act``."""
    kind = activation_kind((act,))
    shape = r.outputs[0].shape
    for i, b in enumerate(base[:-1]):
        if b.order in used or not b.outputs or b.outputs[0].shape != shape:
            continue
        if type_affinity(b.type_name, b.bases, r.type_name, r.bases) < 2:
            continue
        a = next((e for e in base[i + 1 :] if e.parent == b.parent), None)
        if a is not None and a.outputs and a.outputs[0].shape == shape:
            if activation_kind((a.type_name, *a.bases)) == kind and a.order not in used:
                return [b, a]
    return None


def _next_members(
    base: list[Event], members: tuple[str, ...], used: set[int], fused: tuple[tuple[int, ...], int]
) -> list[Event] | None:
    """The first unused calls of sibling layers named ``members`` whose outputs fit the fused one."""
    by_parent: dict[str, dict[str, Event]] = {}
    for e in base:
        if e.order in used or member_name(e.path) not in members:
            continue
        siblings = by_parent.setdefault(parent_path(e.path), {})
        siblings.setdefault(member_name(e.path), e)
        if len(siblings) == len(members):
            found = [siblings[m] for m in members]
            feats = [_features(x) for x in found]
            if all(f is not None and f[0] == fused[0] for f in feats) and sum(f[1] for f in feats) == fused[1]:  # type: ignore[index]
                return found
            del by_parent[parent_path(e.path)]
    return None


def _fused_records(
    parts: list[tuple[TensorRecord, ...]], layout: FusedLayout | None, combine: str
) -> tuple[TensorRecord, ...] | None:
    """One member-by-member list of tensors as one: output features fused, or input gradients summed."""
    if not parts or any(len(p) != len(parts[0]) for p in parts):
        return None
    out = []
    for tensors in zip(*parts):
        first = tensors[0]
        if any(t.value is None for t in tensors):
            fused = _fused_stats(tensors, combine)
            if fused is None:
                return None
            out.append(fused)
            continue
        if combine == "fuse" and layout is not None:
            value = layout.fuse([t.value for t in tensors], axis=-1)  # type: ignore[misc]
        elif combine == "sum":
            if any(t.shape != first.shape for t in tensors):
                return None
            value = np.sum([t.value for t in tensors], axis=0).astype(first.value.dtype)  # type: ignore[union-attr]
        else:
            value = first.value
        out.append(TensorRecord(first.name, tuple(value.shape), first.dtype, value))
    return tuple(out)


def _fused_stats(tensors: tuple[TensorRecord, ...], combine: str) -> TensorRecord | None:
    """Statistics-only records fused: a concatenation's statistics follow from its parts' (the order
    of the features does not change them); a sum's do not."""
    first = tensors[0]
    if any(t.stats is None for t in tensors) or combine == "sum":
        return None
    if combine != "fuse":
        return first
    shape = (*first.shape[:-1], sum(t.shape[-1] for t in tensors))
    stats = concatenated_stats([(t.stats, int(np.prod(t.shape))) for t in tensors])  # type: ignore[misc]
    return TensorRecord(first.name, tuple(shape), first.dtype, None, stats)


def _fused_weights(members: list[Event]) -> tuple[tuple[int, ...], ...]:
    """The weight shapes of the one layer that fuses ``members`` (their output features side by side), so
    pairing weighs them as it weighs a layer's; ``()`` where the members' weights do not line up."""
    feats = [_features(e) for e in members]
    if any(f is None for f in feats) or len({len(e.weights) for e in members}) != 1:
        return ()
    out = []
    for i in range(len(members[0].weights)):
        rests = []
        for e, f in zip(members, feats):
            dims = list(e.weights[i])
            if f[1] not in dims:  # type: ignore[index]
                return ()
            dims.remove(f[1])  # type: ignore[index]
            rests.append(dims)
        if any(r != rests[0] for r in rests):
            return ()
        out.append(tuple(sorted([*rests[0], sum(f[1] for f in feats)])))  # type: ignore[index]
    return tuple(sorted(out))


def fuse_events(events: list[Event], groups: list[FusedGroup], backward: bool = False) -> list[Event]:
    """``events`` with each group's member calls replaced by one event at the first member's place
    (pass the groups whose members are on the side of ``events``).

    Forward: the members' inputs (the same tensor) and their outputs in the fused layout.
    Backward: the gradients arriving at the outputs fused the same way; the gradients leaving
    the shared input are the members' summed.
    """
    if not groups:
        return events
    at = {(e.path, e.call): e for e in events}
    drop: set[int] = set()
    merged: dict[int, Event] = {}
    calls: dict[str, int] = {}
    for g in groups:
        found = [at.get(key) for key in zip(g.members, g.calls)]
        if any(e is None for e in found):
            continue
        members: list[Event] = found  # type: ignore[assignment]
        if g.applied:  # the layer, then its activation as a function: applied to what it gave
            # Backward, the gradient arriving at its output is before the activation on one side, after it on
            # the other: only the gradients leaving its input (and its parameters') compare.
            inputs, outputs = members[0].inputs, () if backward else applied(members[0].outputs, g.applied)
        elif g.layout is None:  # sequential: in at the first member, out at the last
            outputs, inputs = members[-1].outputs, members[0].inputs
        else:
            outputs = _fused_records([e.outputs for e in members], g.layout, "fuse")
            inputs = _fused_records([e.inputs for e in members], g.layout, "sum" if backward else "first")
            if inputs is None and backward and outputs is not None:
                inputs = ()  # statistics of a sum of gradients are not known: compare what arrives
        if outputs is None or inputs is None:
            continue
        first = min(members, key=lambda e: e.order)
        weights = _fused_weights(members) if g.layout is not None else ()
        params = tuple(replace(t, name=f"{member_name(e.path)}.{t.name}") for e in members for t in e.params)
        call = calls[g.path] = calls.get(g.path, -1) + 1
        # A sequential group is called as its first member is (its input is that one's): kept for its replay.
        template = first.template if g.layout is None else None
        merged[first.order] = replace(
            first, path=g.path, call=call, inputs=inputs, outputs=outputs, params=params,
            layer=None, template=template, weights=weights,
        )  # fmt: skip
        drop.update(e.order for e in members)
    return [merged.get(e.order, e) for e in events if e.order not in drop or e.order in merged]
