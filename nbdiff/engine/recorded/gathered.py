"""Runs of different tensor-parallel degrees compared as whole steps (``compare`` of a TP run against a
single-process reference, or TP=2 against TP=4): their shards gathered (:mod:`nbdiff.gather.shards`),
and each finding told which rank's shard differs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from nbdiff.gather.shards import Gathered, Gathering, shard_slices
from nbdiff.judge.blame import Divergence
from nbdiff.judge.metrics import compare_tensors
from nbdiff.trace.dump.store import RankDump
from nbdiff.trace.events import Event, TensorRecord

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
        text, rank = _which(how, t, other, f, side, gathered)  # type: ignore[arg-type]
        return replace(f, shards=text, rank=rank if side == "raw" else f.rank)
    return f


def _which(
    how: Gathering, mine: TensorRecord, other: TensorRecord | None, f: Divergence, side: str, g: Gathered
) -> tuple[str, int]:
    n = len(how.shards)
    if how.unit == "micro-batch":
        return _micro_batch(how, mine, other, f, side, g)
    if how.layout in _ADDED:
        return f"{side} holds it as {_ADDED[how.layout].format(n=n)}: every rank's part adds in", 0
    over = f"{n} data-parallel groups" if any(how.parts) else f"{n} ranks"
    untold = f"{side}'s {how.layout} over {over}; which rank's part differs is not told"
    if other is None or other.value is None or any(s is None for s in how.shards):
        return f"{untold} (statistics only)", 0
    if other.shape != mine.shape:
        return f"{untold} (the other side's tensor is laid out otherwise)", 0
    found = _ranks(how, other.value, f)
    if found is None:
        return f"{untold} (statistics only)" if not how.layout.startswith("strided") else untold, 0
    bad, good, layout = found
    place = lambda r: f"{r} ({p})" if (p := g.place(1 if side == "raw" else 0, r)) else str(r)  # noqa: E731
    what = "copy" if layout == "replicate" else "shard"
    text = f"{side} rank{'s' if len(bad) > 1 else ''} {', '.join(map(place, bad))}: its {what} ({layout}) differs"
    if good:
        text += f"; rank{'s' if len(good) > 1 else ''} {', '.join(map(str, good))} agree{'s' if len(good) == 1 else ''}"
    return text, bad[0] if bad else 0


def _micro_batch(
    how: Gathering, mine: TensorRecord, other: TensorRecord | None, f: Divergence, side: str, g: Gathered
) -> tuple[str, int]:
    """Which micro-batches of a step differ (their calls joined into the whole), and on which rank
    (a micro-batch gathered from ranks followed into its shards)."""
    rank = how.ranks[0] if how.ranks else 0
    place = lambda r: f"{r} ({p})" if (p := g.place(1 if side == "raw" else 0, r)) else str(r)  # noqa: E731
    many = len(how.ranks) > 1
    who = f"{side} rank{'s' if many else ''} {', '.join(map(place, how.ranks or [0]))}"
    untold = f"{who}: its {len(how.shards)} micro-batches make it up; which one differs is not told"
    if how.layout in _ADDED:
        return f"{who}: {_ADDED[how.layout].format(n=len(how.shards))}, each micro-batch's part adds in", rank
    if other is None or other.value is None or any(s is None for s in how.shards) or other.shape != mine.shape:
        return f"{untold} (statistics only)" if other is None or other.value is None else untold, rank
    cuts = shard_slices(how.layout, how.shards, other.value)
    if cuts is None:
        return untold, rank
    ratios = [
        compare_tensors(f.metrics.name, np.asarray(s), c, f.metrics.tolerance, f.metrics.mode).ratio
        for s, c in zip(how.shards, cuts)  # type: ignore[arg-type]
    ]
    bad, good = _split_ratios(ratios)
    held: list[int] = []
    for i in bad:
        part = how.parts[i] if i < len(how.parts) else None
        if part is not None and (sub := _ranks(part, (cuts[i] / how.scale).astype(cuts[i].dtype), f)) is not None:
            held += [r for r in sub[0] if r not in held]
    if held:
        rank, who = held[0], f"{side} rank{'s' if len(held) > 1 else ''} {', '.join(map(place, held))}"
    text = f"{who}, micro-batch{'es' if len(bad) > 1 else ''} {', '.join(map(str, bad))} of {len(ratios)}: "
    text += f"its slice ({how.layout}) differs"
    if good:
        text += f"; micro-batch{'es' if len(good) > 1 else ''} {', '.join(map(str, good))} agree{'s' if len(good) == 1 else ''}"
    return text, rank


def _split_ratios(ratios: list[float]) -> tuple[list[int], list[int]]:
    """The parts beyond tolerance (or, none being, the worst), and the rest."""
    top = max(ratios)
    bad = [i for i, x in enumerate(ratios) if x > 1.0] or [i for i, x in enumerate(ratios) if x >= top / 2 and top > 0]
    return bad, [i for i in range(len(ratios)) if i not in bad]


_ADDED = {
    "partial": "partial sums on {n} ranks (before their all-reduce)",
    "mean": "the mean of {n} data-parallel ranks' own parts (each from its slice of the batch)",
    "sum": "the sum of {n} data-parallel ranks' own parts (each from its slice of the batch)",
}
"""Layouts whose every part adds into the whole: which rank's part is wrong is not told."""


def _ranks(how: Gathering, whole: np.ndarray, f: Divergence) -> tuple[list[int], list[int], str] | None:
    """The ranks whose part of ``whole`` differs, those that agree, and the layout they held it in
    (a data-parallel group's parts followed into its tensor-parallel shards); ``None`` if not told."""
    if how.layout.startswith("strided") or how.layout in _ADDED:
        return None
    cuts = shard_slices(how.layout, how.shards, whole)
    if cuts is None:
        return None
    ratios = [
        compare_tensors(f.metrics.name, np.asarray(s), c, f.metrics.tolerance, f.metrics.mode).ratio
        for s, c in zip(how.shards, cuts)  # type: ignore[arg-type]
    ]
    top = max(ratios)
    wrong = [i for i, x in enumerate(ratios) if x > 1.0] or [
        i for i, x in enumerate(ratios) if x >= top / 2 and top > 0
    ]
    bad: list[int] = []
    good: list[int] = []
    layout = how.layout
    for i in range(len(ratios)):
        rank = how.ranks[i] if i < len(how.ranks) else i
        part = how.parts[i] if i < len(how.parts) else None
        if part is None:
            (bad if i in wrong else good).append(rank)
        elif i not in wrong:
            good += part.ranks or [rank]
        elif (sub := _ranks(part, (cuts[i] / how.scale).astype(cuts[i].dtype), f)) is None:
            bad += part.ranks or [rank]
        else:
            bad, good, layout = bad + sub[0], good + sub[1], sub[2]
    return bad, good, layout
