"""``LayerMap.auto``: propose a LayerMap from one forward pass of each model.

The proposal is what automatic pairing found, written out so the user can paste,
review and edit it: every renamed leaf pair, and the layers left without a
counterpart (as ``ignore`` candidates, commented out).
"""

from __future__ import annotations

from typing import Any

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.pairing import Pair, Pairing
from nbdiff.align.probe import pair_once
from nbdiff.trace.events import Event

__all__ = ["propose_layer_map", "layer_map_source"]


def propose_layer_map(base: Any, raw: Any, inputs: Any, *, show: bool = True) -> LayerMap:
    """Pair the two models by execution order and return the renamed leaf pairs as a LayerMap.

    Only leaves (layers with no paired sublayer) are proposed: mapping a parent would
    compare it at its boundary only. With ``show`` the proposal is printed as code.
    """
    pairing = pair_once(base, raw, inputs)
    proposed = _renamed_leaves(pairing)
    if show:
        print(layer_map_source(pairing, proposed))
    return LayerMap({p.base.path: p.raw.path for p in proposed})


def _renamed_leaves(pairing: Pairing) -> list[Pair]:
    parents = {p.base.parent for p in pairing.pairs}
    seen: set[tuple[str, str]] = set()
    out = []
    for p in pairing.pairs:
        key = (p.base.path, p.raw.path)
        if p.base.order in parents or p.base.path == p.raw.path or key in seen or not p.base.path:
            continue
        seen.add(key)
        out.append(p)
    return out


def layer_map_source(pairing: Pairing, proposed: list[Pair]) -> str:
    """Python source for the proposal, with the evidence for each pair as a comment."""
    lines = [
        f"# nbdiff: {len(pairing.pairs)} layer calls paired by execution order; "
        f"{len(proposed)} renamed leaf pair(s) proposed.",
        "layer_map = nbdiff.LayerMap(",
        "    {",
    ]
    lines += [f"        {p.base.path!r}: {p.raw.path!r},  # {_evidence(p)}" for p in proposed]
    lines.append("    },")
    lost = _unique(pairing.unmatched_base) + _unique(pairing.unmatched_raw)
    if lost:
        lines.append("    # No counterpart found; ignore them if that is expected:")
        lines.append(f"    # ignore={lost!r},")
    lines.append(")")
    return "\n".join(lines)


def _evidence(p: Pair) -> str:
    shapes = ", ".join(str(t.shape) for t in p.base.outputs[:2])
    return f"{p.base.type_name} ~ {p.raw.type_name}, out {shapes}"


def _unique(events: tuple[Event, ...]) -> list[str]:
    return list(dict.fromkeys(e.path for e in events if e.path))
