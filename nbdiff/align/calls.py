"""Nesting of paired calls: API calls paired inside layer pairs, and parents that skip unpaired wrappers."""

from __future__ import annotations

from dataclasses import replace

from nbdiff.align.pairing import Pairing
from nbdiff.trace.apis import align_calls
from nbdiff.trace.events import Event, Kind

__all__ = ["api_pairs", "under_paired_ancestors"]


def api_pairs(pairing: Pairing, base: list[Event], raw: list[Event]) -> list[tuple[Event, Event]]:
    """API calls paired inside each pair of layer calls (sequence alignment of their own code)."""
    bkids: dict[int, list[Event]] = {}
    rkids: dict[int, list[Event]] = {}
    for events, kids in ((base, bkids), (raw, rkids)):
        for e in events:
            if e.kind is Kind.API and e.parent is not None:
                kids.setdefault(e.parent, []).append(e)
    if not bkids and not rkids:
        return []
    out = []
    for p in pairing.pairs:
        out += align_calls(bkids.get(p.base.order, []), rkids.get(p.raw.order, []))
    return out


def under_paired_ancestors(pairs: list[tuple[Event, Event]], events: list[Event]) -> list[tuple[Event, Event]]:
    """Each base event's parent becomes its nearest *paired* ancestor, so an event inside an
    unpaired wrapper hangs under the wrapper's parent instead of becoming a root."""
    parent = {e.order: e.parent for e in events}
    paired = {b.order for b, _ in pairs}
    out = []
    for b, r in pairs:
        p = b.parent
        while p is not None and p not in paired:
            p = parent.get(p)
        out.append((replace(b, parent=p) if p != b.parent else b, r))
    return out
