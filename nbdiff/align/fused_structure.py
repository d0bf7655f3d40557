"""Fused layers paired by structure: a raw ``qkv_proj`` in place of base's sibling ``q_proj``,
``k_proj``, ``v_proj`` (or either side fusing), from the layers' weights, without running them."""

from __future__ import annotations

from typing import Any

from nbdiff.align.fused import FUSED_PATTERNS, FusedGroup, group_path, member_name, parent_path
from nbdiff.frameworks import Framework

__all__ = ["fused_by_structure"]

Unit = tuple[str, Any]


def fused_by_structure(
    bfw: Framework, b: list[Unit], rfw: Framework, r: list[Unit], blayers: dict[str, Any], rlayers: dict[str, Any]
) -> tuple[list[Unit], list[Unit], list[FusedGroup]]:
    """``b`` and ``r`` (each side's layers with weights, in definition order) with each run of sibling
    members that the other side fuses into one layer, at the same place, made one unit (the group's
    path, its first member): a fused group as :func:`~nbdiff.align.fused.find_fused_groups` makes it
    from a step, when the member names, the fused name and the output features say so."""
    out_b: list[Unit] = []
    out_r: list[Unit] = []
    groups: list[FusedGroup] = []
    i = j = 0
    while i < len(b) and j < len(r):
        found = _group(b, i, r[j], bfw, rfw, rlayers, "base")
        if found is not None:
            groups.append(found)
            out_b.append((found.path, b[i][1]))
            out_r.append(r[j])
            i, j = i + len(found.members), j + 1
            continue
        found = _group(r, j, b[i], rfw, bfw, blayers, "raw")
        if found is not None:
            groups.append(found)
            out_b.append(b[i])
            out_r.append((found.path, r[j][1]))
            i, j = i + 1, j + len(found.members)
            continue
        out_b.append(b[i])
        out_r.append(r[j])
        i, j = i + 1, j + 1
    return out_b + b[i:], out_r + r[j:], groups


def _group(
    units: list[Unit], k: int, fused: Unit, members_fw: Framework, fused_fw: Framework, fused_layers: dict[str, Any],
    side: str,
) -> FusedGroup | None:  # fmt: skip
    path, layer = fused
    for pattern in FUSED_PATTERNS:
        n = len(pattern.members)
        run = units[k : k + n]
        if member_name(path) not in pattern.fused or len(run) < n:
            continue
        if {member_name(p) for p, _ in run} != set(pattern.members) or len({parent_path(p) for p, _ in run}) != 1:
            continue
        run = sorted(run, key=lambda u: pattern.members.index(member_name(u[0])))
        sizes = [out_features(members_fw, m) for _, m in run]
        whole = out_features(fused_fw, layer)
        if whole is None or any(s is None for s in sizes) or sum(sizes) != whole:  # type: ignore[misc]
            continue
        layout = pattern.layout(tuple(sizes), fused_layers.get(parent_path(path)))  # type: ignore[arg-type]
        if layout is None:
            continue
        paths = tuple(p for p, _ in run)
        return FusedGroup(group_path(paths), paths, (0,) * n, path, layout, side=side)
    return None


def out_features(fw: Framework, layer: Any) -> int | None:
    """A linear layer's output features from its weights (its bias, else its weight as the framework
    lays it out: torch ``[out, in]``, paddle ``[in, out]``); ``None`` for any other layer."""
    own = dict(fw.direct_params(layer))
    weight, bias = own.get("weight"), own.get("bias")
    if weight is None or not any("Linear" in n for n in fw.class_names(layer)):
        return None
    shape = fw.shape_of(weight)
    if len(shape) != 2:
        return None
    features = shape[1] if fw.name == "paddle" else shape[0]
    if bias is not None and fw.shape_of(bias) != (features,):
        return None
    return features
