"""Pairing layers without running them, when definition order gives a copy that cannot be made.

``assign_weight(base, raw)`` without ``inputs`` pairs the layers that hold weights in definition
order. A port that defines ``o_proj`` before ``qkv_proj`` breaks that order, and the copy fails on
shapes. Before raising, nbdiff tries the other consistent assignment: each base layer takes the raw
layer of the same class with the same weight shapes (a transposed layout counts as the same),
the one of the same attribute name first, else the first unused one in definition order.
"""

from __future__ import annotations

from typing import Any

from nbdiff.align.typemap import canonical_type
from nbdiff.frameworks import Framework
from nbdiff.weights.plan import all_class_names, layer_tensors
from nbdiff.weights.rules import covers_sublayers

__all__ = ["pairs_by_shape"]


def _key(fw: Framework, layer: Any, recursive: bool) -> tuple[str, tuple[tuple[int, ...], ...]]:
    shapes = sorted(tuple(sorted(fw.shape_of(t))) for t in layer_tensors(fw, layer, recursive).values())
    return canonical_type(type(layer).__name__), tuple(shapes)


def _recursive(fw: Framework, layer: Any) -> bool:
    """Whether a rule copies the layer whole (its sublayers' tensors are its own then)."""
    return fw.is_library_layer(layer) and covers_sublayers(fw.name, all_class_names(layer))


def pairs_by_shape(
    bfw: Framework, base: list[tuple[str, Any]], rfw: Framework, raw: list[tuple[str, Any]]
) -> list[tuple[str, str]] | None:
    """``(base path, raw path)`` for every unit of ``base`` and ``raw`` (layers holding weights), each
    base unit taking a raw unit of its class and weight shapes; ``None`` when some cannot."""
    if len(base) != len(raw):
        return None
    free: dict[tuple[str, tuple[tuple[int, ...], ...]], list[str]] = {}  # key -> raw paths, in order
    for path, layer in raw:
        free.setdefault(_key(rfw, layer, _recursive(rfw, layer)), []).append(path)
    out = []
    for path, layer in base:
        fits = free.get(_key(bfw, layer, _recursive(bfw, layer)))
        if not fits:
            return None
        name = path.rsplit(".", 1)[-1]
        pick = next((p for p in fits if p.rsplit(".", 1)[-1] == name), fits[0])
        fits.remove(pick)
        out.append((path, pick))
    return out
