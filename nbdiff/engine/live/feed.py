"""Single-step feeding: the base values each paired raw call is given."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from nbdiff.align.fused import FusedGroup, fuse_events
from nbdiff.align.pairing import Pairing
from nbdiff.engine.types import StepRecord
from nbdiff.trace.calls import Feed
from nbdiff.trace.events import Event, Kind

__all__ = ["feed_for", "guessed_feed", "path_guess", "same_feed"]


def feed_for(brec: StepRecord, pairing: Pairing, diff_phase: str) -> Feed:
    """Base inputs (forward) and base output gradients (backward) of this step, ``brec``, for each raw
    call that ``pairing`` (this step's or an earlier one's) pairs with a base call."""
    groups = [g for g in pairing.fused if g.side == "base"]
    fwd = {(e.path, e.call): e for e in fuse_events(brec.forward, groups)}
    bwd = {(e.path, e.call): e for e in fuse_events(brec.backward, groups, backward=True)}
    now = (((p.raw.path, p.raw.call), fwd.get((p.base.path, p.base.call))) for p in pairing.pairs)
    feed = _feed(((key, e) for key, e in now if e is not None), bwd, diff_phase)
    return _to_raw_members(feed, [g for g in pairing.fused if g.side == "raw"])


def _to_raw_members(feed: Feed, groups: list[FusedGroup]) -> Feed:
    """A raw group's feed given to its members' calls: the inputs to the first (the norm), the gradients
    arriving at its output to the last (the activation); the group itself is no call raw makes."""
    if not groups:
        return feed
    inputs, grads = dict(feed.inputs), dict(feed.grads)
    seen: dict[str, int] = {}
    for g in groups:  # one a call, in order: the k-th of a path is its merged call k (fuse_events)
        key = (g.path, seen.setdefault(g.path, 0))
        seen[g.path] += 1
        if key in inputs:
            inputs[(g.members[0], g.calls[0])] = inputs.pop(key)
        if key in grads:
            grads[(g.members[-1], g.calls[-1])] = grads.pop(key)
    return Feed(inputs, grads)


def guessed_feed(
    brec: StepRecord, diff_phase: str, pairs: Iterable[tuple[str, str]], fused: Iterable[FusedGroup] = ()
) -> Feed:
    """The feed before raw has run once: each base layer call (and base group that a raw layer fuses)
    given to the raw call at its guessed path (:func:`path_guess`) with the same call index.
    Right for most ports; :func:`same_feed` checks it afterwards."""
    groups = [g for g in fused if g.side == "base"]
    raw_path = path_guess([*pairs, *((g.path, g.fused_path) for g in groups)])
    bwd = {(e.path, e.call): e for e in fuse_events(brec.backward, groups, backward=True)}
    calls = [e for e in fuse_events(brec.forward, groups) if e.kind is Kind.LAYER]
    return _feed((((raw_path(e.path), e.call), e) for e in calls), bwd, diff_phase)


def _feed(pairs: Iterable[tuple[tuple[str, int], Event]], bwd: dict[tuple[str, int], Event], diff_phase: str) -> Feed:
    inputs: dict[tuple[str, int], list[np.ndarray | None]] = {}
    grads: dict[tuple[str, int], dict[str, np.ndarray]] = {}
    for key, base in pairs:
        if diff_phase != "backward" and base.depth > 0:  # the root keeps the user's inputs: compared first
            inputs[key] = [t.data for t in base.inputs]
        g = bwd.get((base.path, base.call))
        if g is not None and diff_phase != "forward":
            grads[key] = {t.name: t.data for t in g.outputs}
    return Feed(inputs, grads)


def same_feed(used: Feed, right: Feed, rrec: StepRecord) -> bool:
    """Whether every raw call of ``rrec`` was given what ``right`` gives it (the same base arrays)."""

    def same(a: list[np.ndarray | None] | None, b: list[np.ndarray | None] | None) -> bool:
        a, b = a or [], b or []
        return len(a) == len(b) and all(_same_array(x, y) for x, y in zip(a, b))

    for e in rrec.forward:
        key = (e.path, e.call)
        if not same(used.inputs.get(key), right.inputs.get(key)):
            return False
        g, h = used.grads.get(key) or {}, right.grads.get(key) or {}
        if g.keys() != h.keys() or not all(_same_array(g[k], h[k]) for k in g):
            return False
    return True


def _same_array(x: np.ndarray | None, y: np.ndarray | None) -> bool:
    # The same base record's array, or (a fused group's, concatenated anew each time) equal values.
    if x is y:
        return True
    return x is not None and y is not None and x.shape == y.shape and np.array_equal(x, y)


def path_guess(pairs: Iterable[tuple[str, str]]) -> Callable[[str], str]:
    """Base path to raw path from known ``(base, raw)`` layer pairs (the weight copy's): a renamed
    layer's own path, and its parents' where the last names agree (``l0.fc``/``m0.fc``: ``l0`` is ``m0``);
    any other path under a renamed one moves with it; the rest keep their names."""
    known: dict[str, str] = {}
    for b, r in pairs:
        known.setdefault(b, r)
        bs, rs = b.split("."), r.split(".")
        while len(bs) > 1 and len(rs) > 1 and bs[-1] == rs[-1]:
            bs, rs = bs[:-1], rs[:-1]
            known.setdefault(".".join(bs), ".".join(rs))

    def guess(path: str) -> str:
        parts = path.split(".")
        for n in range(len(parts), 0, -1):
            head = ".".join(parts[:n])
            if head in known:
                return ".".join([known[head], *parts[n:]]) if known[head] else ".".join(parts[n:])
        return path

    return guess
