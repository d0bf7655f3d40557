"""Weights one model ties (one tensor shared by two layers: an embedding and the output head)
where the other keeps two. The tied tensor's gradient is the sum of both layers', so the backward
differs where neither layer does, and after an update the untied copies part: said with the result,
since no layer is at fault (a port that forgot ``tie_word_embeddings``)."""

from __future__ import annotations

from typing import Any

from nbdiff.align.fused import FusedLayers
from nbdiff.frameworks import Framework

__all__ = ["tie_differences"]


def tie_differences(
    bfw: Framework, blayers: dict[str, Any], rfw: Framework, rlayers: dict[str, Any], pairs: list[tuple[str, str]]
) -> list[str]:
    """One line per tensor one side shares between paired layers whose counterparts are two tensors."""
    to_raw = dict(pairs)
    to_base = {r: b for b, r in reversed(pairs)}
    out = []
    for side, fw, layers, ofw, olayers, to_other in (
        ("base", bfw, blayers, rfw, rlayers, to_raw),
        ("raw", rfw, rlayers, bfw, blayers, to_base),
    ):
        for places in _shared(fw, layers):
            theirs = [_param(ofw, olayers, to_other.get(path), name) for path, name in places]
            if None in theirs or len({id(p) for p in theirs}) == 1:
                continue
            named = " and ".join(f"`{path}.{name}`" for path, name in places)
            other = "raw" if side == "base" else "base"
            out.append(
                f"{side} ties {named} (one tensor), {other} keeps them apart: the tied tensor's gradient is the sum "
                f"of both layers' (its backward differs from {other}'s by the other layer's share), and after an "
                "update the untied copies part. Tie them on both sides (tie_word_embeddings) or on neither."
            )
    return out


def _shared(fw: Framework, layers: dict[str, Any]) -> list[list[tuple[str, str]]]:
    """The (path, name) places of each parameter held by more than one layer."""
    owners: dict[int, list[tuple[str, str]]] = {}
    for path, layer in layers.items():
        if isinstance(layer, FusedLayers):
            continue
        for name, p in fw.direct_params(layer):
            owners.setdefault(id(p), []).append((path, name))
    return [places for places in owners.values() if len(places) > 1]


def _param(fw: Framework, layers: dict[str, Any], path: str | None, name: str) -> Any | None:
    layer = layers.get(path) if path is not None else None
    if layer is None or isinstance(layer, FusedLayers):
        return None
    return dict(fw.direct_params(layer)).get(name)
