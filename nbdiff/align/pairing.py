"""Pair base and raw forward events by execution order, type and shape.

Never by ``__init__`` definition order: both sequences are in the order the
layers actually ran. Each base call takes the best raw call in a short window
(by class, output and weight shapes, name, and inside its parent's counterpart),
so a wrapper present on one side only is skipped, and independent work done in
another order still pairs right. Linear in the number of events.

The two trees need not be built alike: a call that holds others pairs only where its first
input and main output can be compared with the other's (one ``features`` Sequential never
pairs with the stem it starts with), two Sequentials only when they hold as many calls (a
flat branch against Conv-Norm-Activation wrappers), and a user's own layer pairs with the
library layer it replaces by shapes and where it sits or what it is handed, not by how its
class is named.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from typing import Any

from nbdiff.align.fused import FusedGroup, find_fused_groups, fuse_events
from nbdiff.align.layer_map import LayerMap
from nbdiff.align.scoring import FULL_NAME, MIN_SCORE, STRONG
from nbdiff.align.scoring import same_shapes as _same_shapes
from nbdiff.align.scoring import score as _score
from nbdiff.align.scoring import unfounded as _unfounded
from nbdiff.align.spans import unequal_spans
from nbdiff.trace.events import Event

__all__ = ["Pair", "Pairing", "pair_forward", "structure_of", "LOOKAHEAD", "LOOKBACK"]

LOOKAHEAD = 24
"""How far after the last paired raw call to look for a base call's counterpart."""
LOOKBACK = 8
"""How far before it: raw calls skipped earlier, when independent work ran in another order."""
AHEAD = 8
"""How many calls on each side an order check looks at (a small alignment, only when in doubt)."""


@dataclass(frozen=True)
class Pair:
    """A base event and the raw event that does the same work."""

    base: Event
    raw: Event
    explicit: bool = False
    """Paired by the user's LayerMap rather than automatically."""
    members: tuple[str, ...] = ()
    """For a LayerMap pair of several base layers run back to back (shown as ``a+b``): their paths.
    Kept apart, so a path holding ``+`` itself (a ModuleDict key) is never split."""


@dataclass(frozen=True)
class Pairing:
    """The result of pairing two forward sequences."""

    pairs: tuple[Pair, ...]
    unmatched_base: tuple[Event, ...] = ()
    unmatched_raw: tuple[Event, ...] = ()
    skipped: tuple[tuple[str, str], ...] = field(default=())
    """``(side:path, reason)`` for events left out by the LayerMap."""
    fused: tuple[FusedGroup, ...] = ()
    """Base calls that one raw call fuses (``qkv_proj`` for ``q_proj``/``k_proj``/``v_proj``),
    each paired as one base event under the group's path."""


def _ancestors(events: list[Event]) -> dict[int, list[Event]]:
    by_order = {e.order: e for e in events}
    out: dict[int, list[Event]] = {}
    for e in events:
        chain, p = [], e.parent
        while p is not None and p in by_order:
            chain.append(by_order[p])
            p = by_order[p].parent
        out[e.order] = chain
    return out


def _filter(
    events: list[Event], layer_map: LayerMap | None, side: str, cut: set[str]
) -> tuple[list[Event], list[tuple[str, str]]]:
    if layer_map is None and not cut:
        return list(events), []
    anc = _ancestors(events)
    kept, skipped = [], []
    for e in events:
        chain = anc[e.order]
        if any(a.path in cut for a in chain):
            continue  # inside an explicitly mapped pair: compared at its boundary only
        if layer_map is not None:
            reason = layer_map.skip_reason(e.path, e.layer, [(a.path, a.layer) for a in chain])
            if reason:
                skipped.append((f"{side}:{e.path or '<root>'}", reason))
                continue
        kept.append(e)
    return kept, skipped


def _explicit(base: list[Event], raw: list[Event], groups: list[tuple[tuple[str, ...], str]]) -> list[Pair]:
    pairs = []
    for base_paths, raw_path in groups:
        raw_calls = [e for e in raw if e.path == raw_path]
        firsts = [e for e in base if e.path == base_paths[0]]
        lasts = [e for e in base if e.path == base_paths[-1]]
        for k, r in enumerate(raw_calls):
            if k >= len(firsts) or k >= len(lasts):
                break
            b = firsts[k]
            if len(base_paths) > 1:
                b = replace(
                    b,
                    path="+".join(base_paths),
                    outputs=lasts[k].outputs,
                    type_name="+".join(next(e.type_name for e in base if e.path == p) for p in base_paths),
                )
            pairs.append(Pair(b, r, explicit=True, members=tuple(base_paths) if len(base_paths) > 1 else ()))
    return pairs


def pair_forward(
    base: list[Event],
    raw: list[Event],
    layer_map: LayerMap | None = None,
    base_layers: dict[str, Any] | None = None,
    raw_layers: dict[str, Any] | None = None,
    like: Pairing | None = None,
) -> Pairing:
    """Pair two forward event sequences (layer events only, in execution order). ``like``: the pairing
    of a step whose calls had the same structure (:func:`structure_of`, both sides): its decisions
    (fused groups, which call pairs with which) are taken for these events, and nothing is searched."""
    groups = layer_map.explicit_pairs(base_layers or {}, raw_layers or {}) if layer_map else []
    base_cut = {p for g, _ in groups for p in g}
    raw_cut = {r for _, r in groups}
    b_kept, b_skip = _filter(base, layer_map, "base", base_cut)
    r_kept, r_skip = _filter(raw, layer_map, "raw", raw_cut)
    explicit = _explicit(b_kept, r_kept, groups)
    b_seq = [e for e in b_kept if e.path not in base_cut]
    r_seq = [e for e in r_kept if e.path not in raw_cut]
    if like is not None:
        fused: list[FusedGroup] = list(like.fused)
    else:
        fused = find_fused_groups(b_seq, r_seq, raw_layers or {}, base_layers) if raw_layers else []
    b_seq = fuse_events(b_seq, [g for g in fused if g.side == "base"])
    r_seq = fuse_events(r_seq, [g for g in fused if g.side == "raw"])

    if like is not None:
        pairs, lost_b, lost_r = _as_before(like, b_seq, r_seq)
    else:
        pairs, lost_b, lost_r = _spans_matched(b_seq, r_seq, explicit, base, raw)
    all_pairs = sorted(pairs + explicit, key=lambda p: p.base.order)
    return Pairing(tuple(all_pairs), tuple(lost_b), tuple(lost_r), tuple(b_skip + r_skip), tuple(fused))


def structure_of(events: list[Event]) -> tuple[tuple[Any, ...], ...]:
    """What pairing reads of a step's layer calls but their values: equal for two steps, the second
    pairs as the first did (a training loop's steps, the common case, are paired once)."""
    return tuple(
        (e.order, e.path, e.call, e.depth, e.parent, e.type_name, e.weights, id(e.layer),
         tuple((t.name, t.shape, t.dtype) for t in e.inputs), tuple((t.name, t.shape, t.dtype) for t in e.outputs))
        for e in events
    )  # fmt: skip


def _as_before(like: Pairing, b_seq: list[Event], r_seq: list[Event]) -> tuple[list[Pair], list[Event], list[Event]]:
    """``like``'s automatic pairs and unpaired calls, taken by order for this step's events (fused as
    ``like``'s were; the LayerMap's own pairs are made again by the caller)."""
    b_at, r_at = {e.order: e for e in b_seq}, {e.order: e for e in r_seq}
    pairs = [Pair(b_at[p.base.order], r_at[p.raw.order], False, p.members) for p in like.pairs if not p.explicit]
    return pairs, [b_at[e.order] for e in like.unmatched_base], [r_at[e.order] for e in like.unmatched_raw]


SPAN_ROUNDS = 4
"""How often pairing runs again without the container pairs whose spans differ (each round
finds the next level of wrongly paired blocks; a model rarely needs more than two)."""


def _spans_matched(
    b_seq: list[Event], r_seq: list[Event], explicit: list[Pair], b_all: list[Event], r_all: list[Event]
) -> tuple[list[Pair], list[Event], list[Event]]:
    """:func:`_match`, again without each pair of calls holding calls whose spans differ, until none
    is left (see :mod:`nbdiff.align.spans`); the user's own LayerMap pairs are kept as given."""
    fixed_b, fixed_r = [p.base for p in explicit], [p.raw for p in explicit]
    kept = {(p.base.order, p.raw.order) for p in explicit}
    forbidden: set[tuple[int, int]] = set()
    for _ in range(SPAN_ROUNDS):
        pairs, lost_b, lost_r = _match(b_seq, r_seq, fixed_b, fixed_r, b_all, r_all, forbidden)
        everything = [(p.base, p.raw) for p in pairs] + list(zip(fixed_b, fixed_r))
        bad = unequal_spans(everything, lost_b, lost_r, b_all, r_all) - kept
        if not bad:
            return pairs, lost_b, lost_r
        forbidden |= bad
    # Still unequal after the last round: those pairs are dropped, their calls left unpaired.
    dropped = [p for p in pairs if (p.base.order, p.raw.order) in bad]
    keep = [p for p in pairs if (p.base.order, p.raw.order) not in bad]
    order_b = sorted(lost_b + [p.base for p in dropped], key=lambda e: e.order)
    order_r = sorted(lost_r + [p.raw for p in dropped], key=lambda e: e.order)
    return keep, order_b, order_r


def _match(
    b_seq: list[Event],
    r_seq: list[Event],
    fixed_b: list[Event],
    fixed_r: list[Event],
    b_all: list[Event],
    r_all: list[Event],
    forbidden: set[tuple[int, int]] = frozenset(),  # type: ignore[assignment]
) -> tuple[list[Pair], list[Event], list[Event]]:
    """Pair each base event with the best raw event in a window from the first unpaired one.

    Execution order decides where to look, not who pairs: independent work done in another
    order (token-type before position embeddings) still pairs by class, shapes and weights.
    A raw event must lie inside the raw counterpart of the base event's nearest paired
    ancestor. A weak match is left to the next base event when that one fits it better.
    """
    b_parent = {e.order: e.parent for e in b_all}
    r_parent = {e.order: e.parent for e in r_all}
    kids = _direct_calls(b_seq, b_all) | _direct_calls(r_seq, r_all)
    partner: dict[int, int] = {b.order: r.order for b, r in zip(fixed_b, fixed_r)}
    used = [False] * len(r_seq)
    pairs: list[Pair] = []
    lost_b: list[Event] = []
    cursor = 0  # just after the last paired raw event
    later = _Later(b_seq)
    for i, a in enumerate(b_seq):
        scope = _paired_ancestor(a.order, b_parent, partner)
        if (
            cursor < len(r_seq)
            and not used[cursor]
            and (a.order, r_seq[cursor].order) not in forbidden
            and _perfect(a, r_seq[cursor], scope, r_parent, kids)
        ):
            best = cursor  # a port that kept the names, classes and shapes: no other call scores as well
        else:
            ahead = b_seq[i + 1 : i + 1 + AHEAD]
            best = _searched(a, ahead, r_seq, used, cursor, scope, r_parent, kids, forbidden)
            if best >= 0 and later.owed(a, r_seq[best], i, kids):
                best = -1
            if best < 0:
                lost_b.append(a)
                continue
        used[best] = True
        cursor = max(cursor, best + 1)
        partner[a.order] = r_seq[best].order
        pairs.append(Pair(a, r_seq[best]))
    lost_r = [e for j, e in enumerate(r_seq) if not used[j]]
    return pairs, lost_b, lost_r


def _searched(
    a: Event,
    upcoming: list[Event],
    r_seq: list[Event],
    used: list[bool],
    cursor: int,
    scope: int | None,
    r_parent: dict[int, int | None],
    kids: dict[int, int],
    forbidden: set[tuple[int, int]] = frozenset(),  # type: ignore[assignment]
) -> int:
    """The raw event for ``a`` in a window from ``cursor`` (-1: none, or it is better left to the
    next of ``upcoming``, base's calls after ``a``); never a raw event ``forbidden`` to it."""
    best, best_score, first = -1, 0.0, -1
    for j in range(max(0, cursor - LOOKBACK), min(len(r_seq), cursor + LOOKAHEAD)):
        if used[j] or (scope is not None and not _inside(r_seq[j].order, scope, r_parent)):
            continue
        if (a.order, r_seq[j].order) in forbidden or (j != cursor and _unfounded(a, j, r_seq, used, cursor)):
            continue
        s = _score(a, r_seq[j], kids) - 0.01 * abs(j - cursor)
        if first < 0 and j >= cursor and s >= MIN_SCORE:
            first = j
        if s > best_score:
            best, best_score = j, s
    if best < 0 or best_score < MIN_SCORE:
        return -1
    if cursor <= first < best:
        ahead = [r for j, r in enumerate(r_seq[first : first + AHEAD], first) if not used[j]]
        if _keeps_order(a, upcoming, ahead, r_seq[first], r_seq[best], kids):
            best, best_score = first, _score(a, r_seq[first], kids)
    if (
        best_score < STRONG
        and upcoming
        and _better_for_next(a, upcoming[0], best, best_score, r_seq, used, cursor, kids)
    ):
        return -1  # e.g. an extra activation on the base side before a swapped one
    return best


class _Later:
    """Base's calls holding weights by their weight shapes, and by those and their attribute name."""

    def __init__(self, b_seq: list[Event]) -> None:
        self.b_seq = b_seq
        self.alike: dict[tuple[tuple[int, ...], ...], list[int]] = {}
        self.named: dict[tuple[tuple[tuple[int, ...], ...], str], list[int]] = {}
        for i, e in enumerate(b_seq):
            if e.weights:
                self.alike.setdefault(e.weights, []).append(i)
                self.named.setdefault((e.weights, e.path.rsplit(".", 1)[-1]), []).append(i)

    def owed(self, a: Event, r: Event, i: int, kids: dict[int, int]) -> bool:
        """Whether ``r`` is better left to a later base call (after ``i``) that it clearly fits better than
        ``a``: a router's Linear is not the shared expert's fused projection, and an expert's projection
        (every token routed to it) not the shared expert's down projection, both running after the experts.
        Looked up by weight shapes, and by those and ``r``'s name, so it stays cheap on repeated blocks."""
        if not (a.weights and r.weights):
            return False
        mine = _score(a, r, kids)
        alike = self.alike.get(r.weights, [])
        named = self.named.get((r.weights, r.path.rsplit(".", 1)[-1]), [])
        later = alike[bisect.bisect_right(alike, i) :][:4] + named[bisect.bisect_right(named, i) :][:1]
        return any(_score(self.b_seq[k], r, kids) > mine + 1 and _same_shapes(self.b_seq[k], r) for k in later)


def _perfect(a: Event, b: Event, scope: int | None, r_parent: dict[int, int | None], kids: dict[int, int]) -> bool:
    """Whether ``b`` scores the most any raw event can for ``a``: the same path and call (a bonus no
    other event gets), the same class, shapes and weights. The window's search, with its distance
    penalty, would pick it too; pairing a model of thousands of layers searched 32 for each."""
    if a.path != b.path or a.call != b.call or (scope is not None and not _inside(b.order, scope, r_parent)):
        return False
    # _score's most: the same class (4 a point of affinity 3), shapes (4), weights (3), path (FULL_NAME).
    best = 4.0 * 3 + 4.0 + (3.0 if a.weights else 0.0) + FULL_NAME
    return _score(a, b, kids) >= best


def _better_for_next(
    a: Event,
    nxt: Event,
    best: int,
    best_score: float,
    r_seq: list[Event],
    used: list[bool],
    cursor: int,
    kids: dict[int, int] | None = None,
) -> bool:
    """Whether ``r_seq[best]`` is better left to the next base call, ``a`` staying unpaired.

    Only when the next call fits it clearly better and has no other counterpart of its own:
    ReLU, GELU against GELU (swapped), GELU must pair both, not leave the ReLU out.
    """
    taken = _score(nxt, r_seq[best], kids)
    if taken <= best_score + 2:
        return False
    window = range(max(0, cursor - LOOKBACK), min(len(r_seq), cursor + LOOKAHEAD))
    other = max((_score(nxt, r_seq[j], kids) for j in window if j != best and not used[j]), default=0.0)
    return taken > best_score + other + 2


def _keeps_order(
    a: Event, later: list[Event], ahead: list[Event], first: Event, best: Event, kids: dict[int, int] | None = None
) -> bool:
    """Whether pairing ``a`` with ``first`` (where it ran) does as well as with ``best`` (later).

    Each choice is scored with the best in-order pairing of the ``later`` base calls to the
    raw calls ``ahead`` that it leaves. Activations in a row, one swapped (GELU, tanh, GELU
    against Tanh, tanh, GELU): the exact class further on must not win over the swapped one
    where it ran, which would cross the pairs. Crossing stays when it scores higher, as for
    independent embeddings whose names say they ran in another order.
    """
    with_first = _score(a, first, kids) + _aligned(later, [r for r in ahead if r is not first], kids)
    with_best = _score(a, best, kids) + _aligned(later, [r for r in ahead if r is not best], kids)
    return with_first >= with_best


def _aligned(base: list[Event], raw: list[Event], kids: dict[int, int] | None = None) -> float:
    """The highest total score of an order-keeping pairing of two short sequences (dynamic programming)."""
    row = [0.0] * (len(raw) + 1)
    for b in base:
        new = [0.0] * (len(raw) + 1)
        for j, r in enumerate(raw, 1):
            s = _score(b, r, kids)
            new[j] = max(row[j], new[j - 1], row[j - 1] + s if s >= MIN_SCORE else 0.0)
        row = new
    return row[-1]


def _direct_calls(seq: list[Event], everything: list[Event]) -> dict[int, int]:
    """``id`` of each event -> how many layer calls ran directly inside it (a container's length)."""
    count: dict[int, int] = {}
    for e in everything:
        if e.parent is not None:
            count[e.parent] = count.get(e.parent, 0) + 1
    return {id(e): count.get(e.order, 0) for e in seq}


def _paired_ancestor(order: int, parent: dict[int, int | None], partner: dict[int, int]) -> int | None:
    """The raw counterpart of the nearest paired ancestor of a base event."""
    p = parent.get(order)
    while p is not None:
        if p in partner:
            return partner[p]
        p = parent.get(p)
    return None


def _inside(order: int, ancestor: int, parent: dict[int, int | None]) -> bool:
    p = parent.get(order)
    while p is not None:
        if p == ancestor:
            return True
        p = parent.get(p)
    return False
