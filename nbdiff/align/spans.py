"""Containers pair only as spans: a block of one side and a block of the other do the same work
only when the calls inside them pair with each other and with nothing outside.

Libraries wrap the same math differently: transformers' BERT attention holds the self-attention
*and* its output projection, residual and LayerNorm, where paddle's ``self_attn`` ends at
``out_proj``. Both give ``[B, T, H]``, so class, shapes and order cannot tell them apart; what
can is what runs inside each. After a pairing, :func:`unequal_spans` names every pair of calls
that hold calls whose insides disagree:

- a call paired inside one and outside the other;
- a call holding weights left unpaired inside one, whose closest counterpart (same class and
  weights, left unpaired on the other side) lies outside the other: the pair itself kept them
  apart, since a call is searched for only inside its paired ancestor's counterpart.

Pairing then runs again without those pairs, so their calls pair leaf by leaf and the blame of
code between them names the leaves (see :mod:`nbdiff.align.pairing`).
"""

from __future__ import annotations

from collections.abc import Iterable

from nbdiff.align.typemap import type_affinity
from nbdiff.trace.events import Event

__all__ = ["unequal_spans", "CANDIDATES"]

CANDIDATES = 8
"""How many unpaired calls of the other side, nearest in execution order, a weighted unpaired call
is tried against (a model with many unpaired LayerNorms stays linear)."""


def _chains(events: Iterable[Event]) -> dict[int, tuple[int, ...]]:
    """``order`` -> the ``order`` of every enclosing call, innermost first."""
    parent = {e.order: e.parent for e in events}
    out: dict[int, tuple[int, ...]] = {}
    for order in parent:
        chain, p = [], parent[order]
        while p is not None:
            chain.append(p)
            p = parent.get(p)
        out[order] = tuple(chain)
    return out


def unequal_spans(
    pairs: list[tuple[Event, Event]],
    lost_base: list[Event],
    lost_raw: list[Event],
    base_all: list[Event],
    raw_all: list[Event],
) -> set[tuple[int, int]]:
    """``(base order, raw order)`` of each pair of calls whose spans differ (see the module)."""
    b_anc, r_anc = _chains(base_all), _chains(raw_all)
    partner = {b.order: r.order for b, r in pairs}
    back = {r.order: b.order for b, r in pairs}
    bad: set[tuple[int, int]] = set()
    for b, r in pairs:
        bad |= _crossed(b.order, r.order, b_anc, r_anc, partner, back)
    raw_pos = {e.order: i for i, e in enumerate(raw_all)}
    base_pos = {e.order: i for i, e in enumerate(base_all)}
    raw_like, base_like = _by_weights(lost_raw), _by_weights(lost_base)
    for x in lost_base:
        if x.weights:
            others = raw_like.get(_weights_key(x), [])
            bad |= _kept_apart(x, others, raw_pos, base_pos, b_anc, r_anc, partner, back)
    for y in lost_raw:
        if y.weights:
            others = base_like.get(_weights_key(y), [])
            flipped = _kept_apart(y, others, base_pos, raw_pos, r_anc, b_anc, back, partner)
            bad |= {(b, r) for r, b in flipped}
    return bad


def _weights_key(e: Event) -> tuple[object, ...]:
    return (e.weights, e.outputs[0].shape if e.outputs else None)


def _by_weights(events: list[Event]) -> dict[tuple[object, ...], list[Event]]:
    """Unpaired calls holding weights, by their weight and output shapes: a call's candidates at once."""
    out: dict[tuple[object, ...], list[Event]] = {}
    for e in events:
        if e.weights and e.outputs:
            out.setdefault(_weights_key(e), []).append(e)
    return out


def _crossed(
    b: int,
    r: int,
    b_anc: dict[int, tuple[int, ...]],
    r_anc: dict[int, tuple[int, ...]],
    partner: dict[int, int],
    back: dict[int, int],
) -> set[tuple[int, int]]:
    """The container pairs that hold one call of the pair ``(b, r)`` but not the other."""
    out = set()
    r_set = set(r_anc.get(r, ()))
    for a in b_anc.get(b, ()):
        if a in partner and partner[a] not in r_set:
            out.add((a, partner[a]))
    b_set = set(b_anc.get(b, ()))
    for a in r_anc.get(r, ()):
        if a in back and back[a] not in b_set:
            out.add((back[a], a))
    return out


def _kept_apart(
    x: Event,
    others: list[Event],
    other_pos: dict[int, int],
    own_pos: dict[int, int],
    own_anc: dict[int, tuple[int, ...]],
    other_anc: dict[int, tuple[int, ...]],
    partner: dict[int, int],
    back: dict[int, int],
) -> set[tuple[int, int]]:
    """The container pairs that keep ``x`` (unpaired, with weights) from its closest unpaired
    counterpart among ``others`` (unpaired calls with its weight and output shapes): the candidate
    crossing the fewest pairs, if it crosses any."""
    like = [y for y in others if type_affinity(x.type_name, x.bases, y.type_name, y.bases) >= 2]
    if not like:
        return set()
    # Nearest by relative place in each side's execution order.
    here = own_pos[x.order] / max(len(own_pos), 1)
    like.sort(key=lambda y: abs(other_pos[y.order] / max(len(other_pos), 1) - here))
    best: set[tuple[int, int]] | None = None
    for y in like[:CANDIDATES]:
        crossed = _crossed(x.order, y.order, own_anc, other_anc, partner, back)
        if best is None or len(crossed) < len(best):
            best = crossed
    return best or set()
