"""Runs of different tensor-parallel degrees compared as whole steps (``compare`` of a TP run against a
single-process reference, or TP=2 against TP=4): their shards gathered (:mod:`nbdiff.align.shards`),
and each finding told which rank's shard differs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from nbdiff.align.shards import Gathered, Gathering, shard_slices
from nbdiff.judge.blame import Divergence
from nbdiff.judge.metrics import compare_tensors
from nbdiff.trace.events import Event, TensorRecord
from nbdiff.trace.store import RankDump

__all__ = ["whole_dumps", "attributed"]


class _WholeSteps(Sequence[list[Event]]):
    def __init__(self, gathered: Gathered, side: int, n: int) -> None:
        self._gathered, self._side, self._n = gathered, side, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, k: int) -> list[Event]:  # type: ignore[override]
        if not 0 <= k < self._n:
            raise IndexError(k)
        return self._gathered.step(k)[self._side]


def whole_dumps(
    a: Sequence[RankDump], b: Sequence[RankDump], shards: Mapping[str, str]
) -> tuple[Gathered, RankDump, RankDump]:
    """Each run as one rank-0 dump of whole tensors, gathered from its ranks step by step."""
    gathered = Gathered(list(a), list(b), dict(shards))
    out = []
    for side, dumps in enumerate((a, b)):
        first = dumps[0]
        n = min(len(d.steps) for d in dumps)
        incomplete = frozenset().union(*(d.incomplete for d in dumps))
        meta = {**first.meta, "complete": all(d.closed for d in dumps), "ranks": len(dumps)}
        out.append(RankDump(first.path.parent, meta, first.layers, _WholeSteps(gathered, side, n), incomplete))
    return gathered, out[0], out[1]


def attributed(findings: Sequence[Divergence], gathered: Gathered) -> list[Divergence]:
    """``findings`` each with the ranks whose shard differs (:attr:`Divergence.shards`), where a
    gathered tensor carries the error."""
    return [_attributed(f, gathered) for f in findings]


def _attributed(f: Divergence, gathered: Gathered) -> Divergence:
    pair = f.event
    if pair is None:
        return f
    for side, (mine, theirs) in (("raw", (pair.raw, pair.base)), ("base", (pair.base, pair.raw))):
        t = mine.tensor(f.metrics.name)
        how = gathered.gatherings.get(f.step, {}).get(id(t)) if t is not None else None
        if how is None:
            continue
        other = theirs.tensor(f.metrics.name)
        text, rank = _which(how, t, other, f, side)  # type: ignore[arg-type]
        return replace(f, shards=text, rank=rank if side == "raw" else f.rank)
    return f


def _which(how: Gathering, mine: TensorRecord, other: TensorRecord | None, f: Divergence, side: str) -> tuple[str, int]:
    n = len(how.shards)
    if how.layout == "partial":
        return f"{side} holds it as partial sums on {n} ranks (before their all-reduce): every rank's part adds in", 0
    untold = f"{side}'s {how.layout} over {n} ranks; which rank's part differs is not told"
    if other is None or other.value is None or any(s is None for s in how.shards):
        return f"{untold} (statistics only)", 0
    if other.shape != mine.shape:
        return f"{untold} (the other side's tensor is laid out otherwise)", 0
    cuts = shard_slices(how.layout, how.shards, other.value)
    if cuts is None:
        return f"{side}'s {how.layout} over {n} ranks; which rank differs is not told (statistics only)", 0
    ratios = [
        compare_tensors(mine.name, np.asarray(s), c, f.metrics.tolerance, f.metrics.mode).ratio
        for s, c in zip(how.shards, cuts)  # type: ignore[arg-type]
    ]
    top = max(ratios)
    bad = [r for r, x in enumerate(ratios) if x > 1.0] or [r for r, x in enumerate(ratios) if x >= top / 2 and top > 0]
    good = [r for r in range(n) if r not in bad]
    what = "copy" if how.layout == "replicate" else "shard"
    text = f"{side} rank{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))}: its {what} ({how.layout}) differs"
    if good:
        text += f"; rank{'s' if len(good) > 1 else ''} {', '.join(map(str, good))} agree{'s' if len(good) == 1 else ''}"
    return text, bad[0] if bad else 0
