"""Copy plans for fused layers: several base layers' tensors into one raw layer's.

Each member is converted to the raw layer's layout by its own rule (``Linear``: transposed
across frameworks), then the members' tensors are fused along the output-feature axis in
the group's :class:`~nbdiff.align.fused.FusedLayout`. The inverse splits and converts
back, so gradients and updates of the fused layer compare member by member.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from nbdiff.align.fused import FusedGroup, FusedLayers, member_name
from nbdiff.errors import WeightTransferError
from nbdiff.frameworks import Framework
from nbdiff.weights.plan import LayerWeights, layer_tensors, plan_layer
from nbdiff.weights.rules import Arrays

__all__ = ["fused_layers", "plan_fused", "plan_unfused", "fused_plan", "unfused_plan"]


def fused_layers(layers: dict[str, Any], groups: tuple[FusedGroup, ...], side: str = "base") -> dict[str, FusedLayers]:
    """A stand-in layer for each group whose members are on ``side``, under the group's path."""
    return {g.path: FusedLayers({member_name(m): layers[m] for m in g.members}) for g in groups if g.side == side}


def _axis(fw: str, cls: str, arr: np.ndarray, size: int) -> int:
    """The output-feature axis of one tensor of the fused layer, in its framework's layout."""
    if arr.ndim <= 1:
        return 0
    first = 0 if fw == "torch" and cls != "Conv1D" else arr.ndim - 1  # torch Linear is [out, in]; the rest [in, out]
    other = arr.ndim - 1 - first
    return first if arr.shape[first] == size or arr.shape[other] != size else other


def plan_fused(
    bfw: Framework, group: FusedGroup, members: FusedLayers, rfw: Framework, rpath: str, rlayer: Any
) -> LayerWeights:
    """The copy plan of one fused group into its raw layer."""
    names = list(members.members)
    if group.layout is None:
        return _plan_sequential(bfw, group, members, rfw, rpath, rlayer)
    plans = {n: plan_layer(bfw, path, members.members[n], rfw, rpath, rlayer) for n, path in zip(names, group.members)}
    btype = "+".join(type(m).__name__ for m in members.members.values())
    return fused_plan(group, plans, rfw.name, rpath, type(rlayer).__name__, btype)


def fused_plan(
    group: FusedGroup, plans: dict[str, LayerWeights], rfw: str, rpath: str, rcls: str, btype: str
) -> LayerWeights:
    """The plan of a laid-out group from each member's own plan into the fused raw layer ``rpath``
    (class ``rcls`` of framework ``rfw``): converted member by member, then fused along the output features."""
    layout, names = group.layout, list(plans)
    assert layout is not None

    def convert(arrays: Arrays) -> Arrays:
        parts = [plans[n].convert(_member(arrays, n)) for n in names]
        out: Arrays = {}
        for key in parts[0]:
            pieces = [p[key] for p in parts]
            axis = _axis(rfw, rcls, pieces[0], layout.sizes[0])
            if any(p.shape[axis] != s for p, s in zip(pieces, layout.sizes)):
                raise WeightTransferError(
                    f"Fused raw `{rpath}.{key}`: the base members {list(group.members)} have "
                    f"{[p.shape for p in pieces]}, which do not give output features {layout.sizes}."
                )
            out[key] = layout.fuse(pieces, axis)
        return out

    def inverse(arrays: Arrays) -> Arrays:
        split = {k: layout.split(v, _axis(rfw, rcls, v, sum(layout.sizes))) for k, v in arrays.items()}
        out: Arrays = {}
        for i, n in enumerate(names):
            back = plans[n].inverse({k: parts[i] for k, parts in split.items()})
            out.update({f"{n}.{k}": v for k, v in back.items()})
        return out

    return LayerWeights(
        group.path, rpath, btype, rcls, f"fused: {layout.name}", False, convert, inverse,
        tuple(o for p in plans.values() for o in p.optional),
    )  # fmt: skip


def _plan_sequential(
    bfw: Framework, group: FusedGroup, members: FusedLayers, rfw: Framework, rpath: str, rlayer: Any
) -> LayerWeights:
    """A layer and its activation: the layer's own rule, under its member name."""
    weighted = [(n, p) for (n, layer), p in zip(members.members.items(), group.members) if layer_tensors(bfw, layer)]
    if len(weighted) != 1:
        raise WeightTransferError(
            f"Raw `{rpath}` applies its activation itself, but {len(weighted)} of base {list(group.members)} hold "
            "weights (one should). Pair them in a LayerMap."
        )
    name, path = weighted[0]
    plan = plan_layer(bfw, path, members.members[name], rfw, rpath, rlayer)

    def convert(arrays: Arrays) -> Arrays:
        return plan.convert(_member(arrays, name))

    def inverse(arrays: Arrays) -> Arrays:
        return {f"{name}.{k}": v for k, v in plan.inverse(arrays).items()}

    return replace(
        plan, base_path=group.path, rule=f"{plan.rule}, then its activation", convert=convert, inverse=inverse
    )


def plan_unfused(
    bfw: Framework, bpath: str, blayer: Any, group: FusedGroup, members: FusedLayers, rfw: Framework
) -> LayerWeights:
    """The copy plan of a fused base layer into the raw layers it stands for (the reverse port)."""
    names = list(members.members)
    btype = type(blayer).__name__
    layout = group.layout
    if layout is None:  # a layer applying its activation itself, against the layer then the activation
        weighted = [(n, p) for n, p in zip(names, group.members) if layer_tensors(rfw, members.members[n])]
        if len(weighted) != 1:
            raise WeightTransferError(
                f"Base `{bpath}` applies its activation itself, but {len(weighted)} of raw {list(group.members)} "
                "hold weights (one should). Pair them in a LayerMap."
            )
        name, path = weighted[0]
        plan = plan_layer(bfw, bpath, blayer, rfw, path, members.members[name])
        return replace(
            plan, raw_path=group.path, rule=f"{plan.rule}, then its activation",
            convert=lambda a: {f"{name}.{k}": v for k, v in plan.convert(a).items()},
            inverse=lambda a: plan.inverse(_member(a, name)),
        )  # fmt: skip

    plans = {n: plan_layer(bfw, bpath, blayer, rfw, p, members.members[n]) for n, p in zip(names, group.members)}
    rtype = "+".join(type(m).__name__ for m in members.members.values())
    return unfused_plan(group, bpath, btype, bfw.name, plans, rtype)


def unfused_plan(
    group: FusedGroup, bpath: str, btype: str, bfw: str, plans: dict[str, LayerWeights], rtype: str
) -> LayerWeights:
    """The plan of a fused base layer (class ``btype`` of framework ``bfw``) into the raw members of a
    laid-out group, from each member's own plan (the reverse port)."""
    layout, names = group.layout, list(plans)
    assert layout is not None

    def convert(arrays: Arrays) -> Arrays:
        whole = sum(layout.sizes)
        split = {}
        for k, v in arrays.items():
            axis = _axis(bfw, btype, v, whole)
            if v.shape[axis] != whole:
                raise WeightTransferError(
                    f"Fused base `{bpath}.{k}` {v.shape} does not give the output features {layout.sizes} of raw "
                    f"{list(group.members)}; pair them in a LayerMap."
                )
            split[k] = layout.split(v, axis)
        out: Arrays = {}
        for i, n in enumerate(names):
            out.update({f"{n}.{k}": v for k, v in plans[n].convert({k: p[i] for k, p in split.items()}).items()})
        return out

    def inverse(arrays: Arrays) -> Arrays:
        parts = [plans[n].inverse(_member(arrays, n)) for n in names]
        return {
            k: layout.fuse([p[k] for p in parts], _axis(bfw, btype, parts[0][k], layout.sizes[0])) for k in parts[0]
        }

    return LayerWeights(
        bpath, group.path, btype, rtype, f"fused: {layout.name}", False, convert, inverse,
        tuple(f"{n}.{o}" for n, p in plans.items() for o in p.optional),
    )  # fmt: skip


def _member(arrays: Arrays, name: str) -> Arrays:
    prefix = f"{name}."
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
