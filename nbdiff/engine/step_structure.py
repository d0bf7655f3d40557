"""How one step's calls pair and nest, for its blame: the forward pairing (an error where two models
share nothing), the events a pass ends in, and each compared call's nearest compared ancestor and
children (a block left unpaired is looked through)."""

from __future__ import annotations

from typing import Any

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.pairing import Pairing, pair_forward
from nbdiff.engine.types import StepRecord
from nbdiff.errors import PairingError
from nbdiff.judge.blame import EventDiff
from nbdiff.trace.events import Event, Kind

__all__ = ["pair_step", "layer_calls", "final_forward", "final_backward", "paired_parents", "paired_children"]


def pair_step(
    brec: StepRecord,
    rrec: StepRecord,
    layer_map: LayerMap | None,
    blayers: dict[str, Any],
    rlayers: dict[str, Any],
    required: bool = True,
    like: Pairing | None = None,
) -> Pairing:
    """The step's layer calls paired; ``like``: a step's pairing whose calls had the same structure
    (:func:`~nbdiff.align.pairing.structure_of`), taken instead of searching again."""
    b, r = layer_calls(brec), layer_calls(rrec)
    pairing = pair_forward(b, r, layer_map, blayers or None, rlayers or None, like)
    nb, nr = len(pairing.pairs) + len(pairing.unmatched_base), len(pairing.pairs) + len(pairing.unmatched_raw)
    inner = [p for p in pairing.pairs if p.base.depth > 0 or p.raw.depth > 0]
    # Structures that differ a lot still pair what they can (blame then names the first layer that
    # differs); only two models with sublayers and not one pair between them is an error.
    if required and (not pairing.pairs or (not inner and pairing.unmatched_base and pairing.unmatched_raw)):
        # The roots rarely tell the user anything: name the first unpaired sublayers.
        ub = next((e for e in pairing.unmatched_base if e.path), next(iter(pairing.unmatched_base), None))
        ur = next((e for e in pairing.unmatched_raw if e.path), next(iter(pairing.unmatched_raw), None))
        show = lambda e: (
            "none" if e is None else f"`{e.path or '<root>'}` ({e.type_name}, outputs {[t.shape for t in e.outputs]})"
        )  # noqa: E731
        raise PairingError(
            f"The two models' layer calls could not be paired: {len(pairing.unmatched_base)} of {nb} base and "
            f"{len(pairing.unmatched_raw)} of {nr} raw calls have no counterpart. First unpaired: base {show(ub)}, "
            f"raw {show(ur)}. Pair them explicitly: LayerMap({{{ub.path if ub else 'base.path'!r}: "
            f"{ur.path if ur else 'raw.path'!r}}}), or ignore layers with LayerMap(ignore=[...])."
        )
    return pairing


def layer_calls(rec: StepRecord) -> list[Event]:
    """The step's forward layer calls, in execution order (what pairing reads)."""
    return [e for e in rec.forward if e.kind is Kind.LAYER]


def final_forward(d: EventDiff) -> bool:
    """The model's own outputs and the loss: what the user sees of a forward pass."""
    return d.base.kind is Kind.LOSS or (d.base.kind is Kind.LAYER and d.base.parent is None and d.base.depth == 0)


def final_backward(d: EventDiff) -> bool:
    """Parameter gradients: what the optimizer sees of a backward pass."""
    params = {t.name for t in d.raw.params} | {t.name for t in d.base.params}
    return any(not t.passed and t.name in params for t in d.tensors) or bool(
        params and any(not t.passed and not t.name.startswith("in") for t in d.tensors)
    )


def paired_parents(diffs: list[EventDiff], everything: list[Event]) -> dict[int, int | None]:
    """Base order of each compared layer call -> its nearest compared ancestor's: a block left unpaired
    between them (torchvision's ``block`` Sequential, which paddle.vision does not have) is looked through,
    so the ancestor's own error leaves out what its paired sublayers made."""
    parent = {e.order: e.parent for e in everything}
    paired = {d.base.order for d in diffs if d.base.kind is Kind.LAYER}
    out: dict[int, int | None] = {}
    for d in diffs:
        p = d.base.parent
        while p is not None and p not in paired:
            p = parent.get(p)
        out[d.base.order] = p
    return out


def paired_children(diffs: list[EventDiff], up: dict[int, int | None]) -> dict[int, list[tuple[Event, Event]]]:
    """Base order of a layer call -> the paired layer calls under it, with no paired call between."""
    out: dict[int, list[tuple[Event, Event]]] = {}
    for d in diffs:
        p = up.get(d.base.order, d.base.parent)
        if d.base.kind is Kind.LAYER and p is not None:
            out.setdefault(p, []).append((d.base, d.raw))
    return out
