"""Naming the calls that stayed unpaired where a layer's own code is blamed.

A port's own layer that nothing could pair with (a custom activation where the original calls
``F.relu`` in its code) runs between two paired sublayers; when the error first appears
there, blame lands on the parent's code "between" them, and these calls are named with it.
"""

from __future__ import annotations

from dataclasses import replace

from nbdiff.align.pairing import Pairing
from nbdiff.judge.blame import Divergence
from nbdiff.trace.events import Event

__all__ = ["with_unpaired"]


def with_unpaired(f: Divergence, pairing: Pairing) -> Divergence:
    """A blame of a layer's own code names the calls that stayed unpaired inside it, between the two
    sublayers: a user's layer nothing could pair with is where such an error usually comes from."""
    if f.event is None or not (pairing.unmatched_base or pairing.unmatched_raw):
        return f
    by_label = {_call_label(p.base): p for p in pairing.pairs}
    ends = [by_label.get(x) for x in f.between if x is not None]
    names = []
    for side, lost, owner in (
        ("base", pairing.unmatched_base, f.event.base.order),
        ("raw", pairing.unmatched_raw, f.event.raw.order),
    ):
        inside = [getattr(p, side).order for p in ends if p is not None]
        lo, hi = (min(inside), max(inside)) if len(inside) == 2 else (owner, None)
        if len(inside) == 1:
            lo, hi = (inside[0], None) if f.between[1] is None else (owner, inside[0])
        names += [
            f"{side} `{e.path}` ({e.type_name})"
            for e in lost
            if e.parent is not None and _under(e, owner, lost) and lo < e.order and (hi is None or e.order < hi)
        ]
    return replace(f, unpaired=tuple(names[:6])) if names else f


def _call_label(e: Event) -> str:
    return (e.path or "<root>") + (f"#{e.call}" if e.call else "")


def _under(e: Event, owner: int, lost: tuple[Event, ...]) -> bool:
    """Whether ``e`` runs inside ``owner``, through unpaired calls only."""
    parents = {x.order: x.parent for x in lost}
    p = e.parent
    while p is not None and p != owner:
        p = parents.get(p)
    return p == owner
