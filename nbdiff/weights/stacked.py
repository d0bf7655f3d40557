"""Stacked experts against a list of experts: one layer holding every expert's weights in 3-D tensors
(transformers 5: ``gate_up_proj`` ``[E, 2I, H]``, ``down_proj`` ``[E, H, I]``) against a list of ``E``
expert layers each holding its own (paddleformers: ``experts.e.up_gate_proj``, ``experts.e.down_proj``).

Expert ``e`` of the stack is slice ``e`` of each tensor, laid out as torch's ``F.linear`` takes it
(``[out, in]``). It goes to the expert's tensor whose layer is named alike (``gate_up`` ~ ``up_gate``,
the same words in any order), else the one of its shape; paddle's Linear keeps ``[in, out]``, so a
slice is transposed into it. The inverse stacks the experts back, so gradients and updates compare.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from nbdiff.errors import WeightTransferError
from nbdiff.frameworks import Framework
from nbdiff.weights.plan import LayerWeights, layer_tensors
from nbdiff.weights.rules import Arrays

__all__ = ["stacked_count", "plan_stacked"]

_FILLER = {"proj", "weight", "bias", "w", "linear", "layer"}


def stacked_count(fw: Framework, layer: Any) -> int:
    """How many experts a layer stacks (the shared first axis of its own tensors, one of them 3-D); 0: none."""
    own = [fw.shape_of(t) for t in layer_tensors(fw, layer).values()]
    if not own or not any(len(s) == 3 for s in own) or any(len(s) < 2 for s in own):
        return 0
    firsts = {s[0] for s in own}
    return firsts.pop() if len(firsts) == 1 and min(s[0] for s in own) > 1 else 0


def _experts(fw: Framework, layer: Any, count: int) -> list[tuple[str, Any]] | None:
    """The ``count`` expert layers a list holds (``0`` … ``count - 1``), each holding tensors."""
    kids = {path: sub for path, sub in fw.named_layers(layer) if path and "." not in path}
    out = [(str(e), kids.get(str(e))) for e in range(count)]
    if len(kids) != count or any(sub is None or not layer_tensors(fw, sub, True) for _, sub in out):
        return None
    return out


def _words(name: str) -> frozenset[str]:
    return frozenset(w for w in name.replace(".", "_").lower().split("_") if w and w not in _FILLER)


def _slot(stacked: str, shape: tuple[int, ...], mine: dict[str, tuple[int, ...]], transposed: bool) -> str:
    """Which of an expert's tensors takes one stacked tensor's slice of ``shape``."""
    want = tuple(reversed(shape)) if transposed and len(shape) == 2 else shape
    kind = stacked.rsplit(".", 1)[-1] if stacked.endswith(("weight", "bias")) else ""
    fits = [n for n, s in mine.items() if tuple(s) == want and (not kind or n.endswith(kind))]
    named = [n for n in fits if _words(n.rsplit(".", 1)[0]) == _words(stacked)]
    if len(named) == 1 or len(fits) == 1:
        return (named or fits)[0]
    raise WeightTransferError(
        f"Stacked experts' `{stacked}` {shape}: no single tensor of an expert ({mine}) takes its slice; "
        "register a weight rule for these layers."
    )


def plan_stacked(
    bfw: Framework, bpath: str, blayer: Any, rfw: Framework, rpath: str, rlayer: Any
) -> LayerWeights | None:
    """The plan of stacked experts into a list of experts, or of a list into a stack; ``None`` when the
    two layers are not such a pair."""
    count = stacked_count(bfw, blayer)
    if count and (experts := _experts(rfw, rlayer, count)) is not None:
        convert, inverse = _layout(bfw, blayer, rfw, experts)
        return LayerWeights(
            bpath, rpath, type(blayer).__name__, type(rlayer).__name__, "stacked experts", True, convert, inverse
        )
    count = stacked_count(rfw, rlayer)
    if count and (experts := _experts(bfw, blayer, count)) is not None:
        inverse, convert = _layout(rfw, rlayer, bfw, experts)
        return LayerWeights(
            bpath, rpath, type(blayer).__name__, type(rlayer).__name__, "stacked experts", True, convert, inverse
        )
    return None


def _layout(sfw: Framework, stack: Any, lfw: Framework, experts: list[tuple[str, Any]]) -> tuple[Any, Any]:
    """``(stack arrays -> list arrays, list arrays -> stack arrays)`` by the slots of the first expert."""
    shapes = {n: tuple(sfw.shape_of(t)) for n, t in layer_tensors(sfw, stack).items()}
    mine = {n: tuple(lfw.shape_of(t)) for n, t in layer_tensors(lfw, experts[0][1], True).items()}
    transposed = lfw.name == "paddle" and sfw.name != "paddle"  # paddle's Linear is [in, out]
    slots = {n: _slot(n, s[1:], mine, transposed) for n, s in shapes.items()}
    flip = lambda a: a.T if transposed and a.ndim == 2 else a  # noqa: E731

    def convert(arrays: Arrays) -> Arrays:
        return {f"{e}.{slots[n]}": np.ascontiguousarray(flip(arrays[n][int(e)])) for e, _ in experts for n in slots}

    def inverse(arrays: Arrays) -> Arrays:
        return {n: np.stack([flip(arrays[f"{e}.{slot}"]) for e, _ in experts]) for n, slot in slots.items()}

    return convert, inverse
