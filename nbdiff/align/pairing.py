"""Pair base and raw forward events by execution order, type and shape.

Never by ``__init__`` definition order: both sequences are in the order the
layers actually ran, and are aligned greedily with a short lookahead, so a
wrapper layer present on one side only is skipped, not fatal. Linear in the
number of events.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from nbdiff.align.layer_map import LayerMap
from nbdiff.align.typemap import equivalent_types
from nbdiff.trace.events import Event

__all__ = ["Pair", "Pairing", "pair_forward", "LOOKAHEAD"]

LOOKAHEAD = 24
"""How far ahead to look for a strong match before accepting a weak one."""


@dataclass(frozen=True)
class Pair:
    """A base event and the raw event that does the same work."""

    base: Event
    raw: Event
    explicit: bool = False
    """Paired by the user's LayerMap rather than automatically."""


@dataclass(frozen=True)
class Pairing:
    """The result of pairing two forward sequences."""

    pairs: tuple[Pair, ...]
    unmatched_base: tuple[Event, ...] = ()
    unmatched_raw: tuple[Event, ...] = ()
    skipped: tuple[tuple[str, str], ...] = field(default=())
    """``(side:path, reason)`` for events left out by the LayerMap."""


def _shapes(e: Event) -> tuple[tuple[int, ...], ...]:
    return tuple(t.shape for t in e.outputs)


def _score(a: Event, b: Event) -> int:
    """3: same type, output shapes and depth; 2: same type and shapes; 1: plausible; 0: different."""
    same_type = equivalent_types(a.type_name, b.type_name)
    same_shape = _shapes(a) == _shapes(b)
    if same_type and same_shape:
        return 3 if a.depth == b.depth else 2
    if same_type or (not a.library and not b.library and same_shape and a.outputs):
        return 1
    return 0


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
            pairs.append(Pair(b, r, explicit=True))
    return pairs


def pair_forward(
    base: list[Event],
    raw: list[Event],
    layer_map: LayerMap | None = None,
    base_layers: dict[str, Any] | None = None,
    raw_layers: dict[str, Any] | None = None,
) -> Pairing:
    """Pair two forward event sequences (layer events only, in execution order)."""
    groups = layer_map.explicit_pairs(base_layers or {}, raw_layers or {}) if layer_map else []
    base_cut = {p for g, _ in groups for p in g}
    raw_cut = {r for _, r in groups}
    b_kept, b_skip = _filter(base, layer_map, "base", base_cut)
    r_kept, r_skip = _filter(raw, layer_map, "raw", raw_cut)
    explicit = _explicit(b_kept, r_kept, groups)
    b_seq = [e for e in b_kept if e.path not in base_cut]
    r_seq = [e for e in r_kept if e.path not in raw_cut]

    pairs: list[Pair] = []
    lost_b: list[Event] = []
    lost_r: list[Event] = []
    i = j = 0
    while i < len(b_seq) and j < len(r_seq):
        a, b = b_seq[i], r_seq[j]
        s = _score(a, b)
        if s >= 2:
            pairs.append(Pair(a, b))
            i += 1
            j += 1
            continue
        if _substitution(b_seq, r_seq, i, j):
            # Same place, same shapes, different class (say GELU vs ReLU): that is the pair.
            pairs.append(Pair(a, b))
            i += 1
            j += 1
            continue
        skip = _lookahead(b_seq, r_seq, i, j)
        if skip is not None:
            side, k = skip
            if side == "raw":
                lost_r += r_seq[j : j + k]
                j += k
            else:
                lost_b += b_seq[i : i + k]
                i += k
        elif s == 1:
            pairs.append(Pair(a, b))
            i += 1
            j += 1
        else:
            lost_b.append(a)
            lost_r.append(b)
            i += 1
            j += 1
    lost_b += b_seq[i:]
    lost_r += r_seq[j:]
    all_pairs = sorted(pairs + explicit, key=lambda p: p.base.order)
    return Pairing(tuple(all_pairs), tuple(lost_b), tuple(lost_r), tuple(b_skip + r_skip))


def _substitution(b_seq: list[Event], r_seq: list[Event], i: int, j: int) -> bool:
    a, b = b_seq[i], r_seq[j]
    if _shapes(a) != _shapes(b) or not a.outputs or a.depth != b.depth:
        return False
    nxt_b, nxt_r = i + 1 < len(b_seq), j + 1 < len(r_seq)
    if not nxt_b and not nxt_r:
        return True
    return nxt_b and nxt_r and _score(b_seq[i + 1], r_seq[j + 1]) >= 2


def _lookahead(b_seq: list[Event], r_seq: list[Event], i: int, j: int) -> tuple[str, int] | None:
    """The shortest skip on one side that reaches a strong match (same depth first)."""
    for want in (3, 2):
        for k in range(1, LOOKAHEAD + 1):
            if j + k < len(r_seq) and _score(b_seq[i], r_seq[j + k]) >= want:
                return ("raw", k)
            if i + k < len(b_seq) and _score(b_seq[i + k], r_seq[j]) >= want:
                return ("base", k)
    return None
